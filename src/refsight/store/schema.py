"""The store's tables, their version and their migrations: one definition for SQLite and PostgreSQL.

:class:`~refsight.store.sqlite.SqliteDatabase` runs this schema as written;
:class:`~refsight.store.postgres.PgDatabase` translates its types (``REAL`` → ``DOUBLE
PRECISION`` ...) and runs the same statements. Both set a new database up with
:func:`create` and check (and migrate in place) an existing one with :func:`upgrade`, inside
their write transaction, so the rules are written once: a store of a newer refsight is
refused, an older one migrated, and anything that is not a refsight store — another
application's tables, an unreadable ``schema_version`` — is refused with a
:class:`~refsight.errors.StoreError` that says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..errors import StoreError

__all__ = ["SCHEMA", "MIGRATIONS", "SCHEMA_VERSION", "APPLICATION", "DB_NAME", "statements", "create", "upgrade"]

#: Bumped when the tables change; a store written by a newer refsight is refused,
#: an older one is migrated in place (see ``MIGRATIONS``).
SCHEMA_VERSION = 6
APPLICATION = "refsight"
DB_NAME = "refsight.db"

SCHEMA = """
CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE packages (
    key TEXT PRIMARY KEY,
    image_sha256 TEXT NOT NULL,
    fingerprint_digest TEXT NOT NULL,
    fingerprint_json TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    spec_json TEXT NOT NULL,
    created_at REAL NOT NULL,
    encode_ms REAL NOT NULL,
    checksum TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX packages_by_image ON packages (image_sha256);
CREATE TABLE "references" (
    namespace TEXT NOT NULL,
    ref_id TEXT NOT NULL,
    image_sha256 TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (namespace, ref_id)
);
CREATE INDEX references_by_image ON "references" (image_sha256);
CREATE TABLE reference_packages (
    namespace TEXT NOT NULL,
    ref_id TEXT NOT NULL,
    fingerprint_digest TEXT NOT NULL,
    package_key TEXT NOT NULL,
    PRIMARY KEY (namespace, ref_id, fingerprint_digest)
);
CREATE INDEX reference_packages_by_key ON reference_packages (package_key);
CREATE TABLE images (
    sha256 TEXT PRIMARY KEY,
    path TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    format TEXT,
    checksum TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE counters (name TEXT PRIMARY KEY, value REAL NOT NULL) WITHOUT ROWID;
-- version 2: a change journal (one row per id ever used in a namespace, holding its latest
-- revision), so derived indexes catch up in O(changes), not O(references)
CREATE TABLE reference_changes (
    namespace TEXT NOT NULL,
    ref_id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    removed INTEGER NOT NULL,
    PRIMARY KEY (namespace, ref_id)
) WITHOUT ROWID;
CREATE INDEX reference_changes_by_revision ON reference_changes (namespace, revision);
-- version 3: the isolation scope that salts a package's key (NULL: shared across namespaces)
ALTER TABLE packages ADD COLUMN scope TEXT;
-- version 4: when each package was last used (buffered, see store/usage.py), for the byte
-- quota's least-recently-used eviction (existing packages start at their creation time)
ALTER TABLE packages ADD COLUMN last_used REAL NOT NULL DEFAULT 0;
UPDATE packages SET last_used = created_at;
CREATE INDEX packages_by_use ON packages (last_used);
-- version 5: remembered images: the packages of images a tenant sent inline and the store keeps
-- (remember_images, see refsight/remembered.py), one row per namespace that sent the image again
-- (a package some row names is in use, as a reference's linked package is)
CREATE TABLE remembered_packages (
    namespace TEXT NOT NULL,
    package_key TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (namespace, package_key)
) WITHOUT ROWID;
CREATE INDEX remembered_packages_by_key ON remembered_packages (package_key);
-- version 6: each package's bytes before the store's codec compressed them (vllm_connector/refsight_codec.py): ``bytes``
-- stays what the file holds, the size the quota counts, and every older file was written raw
ALTER TABLE packages ADD COLUMN raw_bytes INTEGER NOT NULL DEFAULT 0;
UPDATE packages SET raw_bytes = bytes;
"""

#: Statements that bring a store from version ``v`` to ``v + 1``.
MIGRATIONS = {
    # The journal starts empty: a reader that has never synced lists every reference anyway.
    1: SCHEMA[SCHEMA.index("-- version 2") : SCHEMA.index("-- version 3")],
    # Existing packages were all shared: NULL is exactly their scope.
    2: SCHEMA[SCHEMA.index("-- version 3") : SCHEMA.index("-- version 4")],
    3: SCHEMA[SCHEMA.index("-- version 4") : SCHEMA.index("-- version 5")],
    # No image was remembered before: the table starts empty.
    4: SCHEMA[SCHEMA.index("-- version 5") : SCHEMA.index("-- version 6")],
    # Packages written before the codec are raw files: their raw size is their size.
    5: SCHEMA[SCHEMA.index("-- version 6") :],
}


def statements(script: str) -> list[str]:
    """The statements of ``script``, one by one (``executescript`` would commit the caller's transaction)."""
    out = []
    for statement in script.split(";"):
        lines = [line for line in statement.splitlines() if not line.strip().startswith("--")]
        if "".join(lines).strip():
            out.append("\n".join(lines))
    return out


def create(conn, schema: str = SCHEMA) -> None:
    """Set up the tables of a new store in the caller's write transaction (``schema`` in the database's types)."""
    for statement in statements(schema):
        conn.execute(statement)
    conn.executemany(
        "INSERT INTO meta (name, value) VALUES (?, ?)",
        [("application", APPLICATION), ("schema_version", str(SCHEMA_VERSION))],
    )


def upgrade(conn, where: str, migrations: Mapping[int, str] = MIGRATIONS, *,
            foreign: Callable[[], StoreError] | None = None) -> int:
    """Check an existing store's ``meta`` and migrate it in place (caller's write transaction); its version.

    ``where`` names the database in errors; ``foreign()`` is the error for a database of another
    application. Raises :class:`StoreError` for that, for an unreadable or newer version, and for
    an older one no migration reaches.
    """
    meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
    if meta.get("application") != APPLICATION:
        raise foreign() if foreign else StoreError(f"{where} is a database but not a refsight store")
    version = _version(meta.get("schema_version", "0"), where)
    if version > SCHEMA_VERSION:
        raise StoreError(f"{where} has schema version {version}, newer than this refsight ({SCHEMA_VERSION}); upgrade refsight")
    while version < SCHEMA_VERSION and version in migrations:
        for statement in statements(migrations[version]):
            conn.execute(statement)
        version += 1
        conn.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(version),))
    if version < SCHEMA_VERSION:
        raise StoreError(f"{where} has schema version {version}, which this refsight cannot read")
    return version


def _version(text: object, where: str) -> int:
    # Only a plain decimal integer: 'abc', '' and '4.0' are damage, not versions.
    if not isinstance(text, str) or not text.isascii() or not text.isdigit():
        raise StoreError(f"{where} is not a refsight store: unreadable schema version {text!r} (an integer was expected)")
    return int(text)
