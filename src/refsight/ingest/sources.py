"""What ``refsight ingest SOURCE`` reads: a directory, a text file of paths, or a Parquet/CSV manifest.

Every form becomes a list of :class:`IngestItem` (a path, an optional reference id, metadata),
in a stable order, so two runs over the same source name the same references:

- a **directory** is walked recursively (hidden entries skipped); files with an image suffix
  (:data:`IMAGE_SUFFIXES`) are taken, and each gets an id derived from its path relative to the
  directory (``shoes/red/12.jpg`` → ``shoes.red.12``), so equal file names in two folders do not collide;
- a **text file** (any other suffix) lists one path per line, relative to the file's folder when not
  absolute; blank lines and ``#`` comments are skipped;
- a **manifest** (``.parquet`` or ``.csv``) has a ``path`` column, an optional ``ref_id`` column, and
  every other column becomes metadata (empty CSV cells and nulls are left out).

A listed path that is missing or not an image is *not* refused here: it becomes an error row of
the ingest report, like any other bad file.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidInputError
from ..support.extras import install_command
from ..inputs.reading import FileReadError, read_regular_file

__all__ = ["IMAGE_SUFFIXES", "IngestItem", "list_source"]

#: File suffixes a directory walk takes (case-insensitive); other files are not images to ingest.
IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".ico", ".ppm", ".pgm", ".pbm"}
)
#: Largest text file of paths or CSV manifest read (a Parquet manifest is read by pyarrow, in columns).
MAX_LIST_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True)
class IngestItem:
    """One image to ingest: its path, the id asked for (``ref_id``) or one to derive from (``name``), metadata."""

    path: str
    ref_id: str | None = None
    name: str | None = None  # the id is derived from this name's stem when ``ref_id`` is None
    metadata: dict[str, Any] = field(default_factory=dict)


def list_source(source: str | os.PathLike[str]) -> list[IngestItem]:
    """The items of ``source`` (see the module docstring); InvalidInputError naming it when unreadable."""
    path = Path(source)
    if path.is_dir():
        return _walk(path)
    if not path.exists():
        raise InvalidInputError(str(path), "no such file or directory")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _parquet(path)
    text = _read_text(path)
    if suffix == ".csv":
        return _csv(path, text)
    return _paths(path, text)


def _walk(root: Path) -> list[IngestItem]:
    items = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or Path(name).suffix.lower() not in IMAGE_SUFFIXES:
                continue
            full = Path(folder) / name
            relative = full.relative_to(root)
            items.append(IngestItem(str(full), name=".".join(relative.parent.parts + (relative.name,))))
    return items


def _read_text(path: Path) -> str:
    try:
        # A regular file only, never blocking (a FIFO) and never unbounded.
        return read_regular_file(path, MAX_LIST_BYTES).decode("utf-8")
    except FileReadError as e:
        raise InvalidInputError(str(path), f"cannot read the source list: {e.reason}") from None
    except UnicodeDecodeError:
        raise InvalidInputError(str(path), "the source list is not UTF-8 text") from None


def _resolve(base: Path, value: str) -> str:
    p = Path(value)
    return str(p if p.is_absolute() else base / p)


def _paths(path: Path, text: str) -> list[IngestItem]:
    base = path.parent
    lines = (line.strip() for line in text.splitlines())
    return [IngestItem(_resolve(base, line)) for line in lines if line and not line.startswith("#")]


def _rows_to_items(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> list[IngestItem]:
    if "path" not in columns:
        raise InvalidInputError(str(path), f"a manifest needs a 'path' column (it has {', '.join(columns) or 'none'})")
    items = []
    for number, row in enumerate(rows, 1):
        value = row.get("path")
        if not isinstance(value, str) or not value.strip():
            raise InvalidInputError(f"{path} row {number}", "the path is empty")
        ref_id = row.get("ref_id")
        ref_id = None if ref_id in (None, "") else str(ref_id)
        metadata = {k: _plain(v) for k, v in row.items() if k not in ("path", "ref_id") and v not in (None, "")}
        items.append(IngestItem(_resolve(path.parent, value.strip()), ref_id=ref_id, metadata=metadata))
    return items


def _plain(value: Any) -> Any:
    # Parquet cells may be dates, decimals, numpy scalars: keep JSON types, stringify the rest.
    if isinstance(value, (str, int, float, bool)):
        return value
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def _csv(path: Path, text: str) -> list[IngestItem]:
    reader = csv.DictReader(io.StringIO(text))
    try:
        rows = list(reader)
    except csv.Error as e:
        raise InvalidInputError(str(path), f"not a CSV manifest: {e}") from None
    return _rows_to_items(path, rows, list(reader.fieldnames or []))


def _parquet(path: Path) -> list[IngestItem]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InvalidInputError(str(path), f"reading a Parquet manifest needs pyarrow ({install_command('ray')})") from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises its own error types for every malformed file
        raise InvalidInputError(str(path), f"not a Parquet manifest: {e}") from None
    return _rows_to_items(path, table.to_pylist(), list(table.column_names))
