"""API keys → namespaces (tenants).

Keys come from a file (one ``key=namespace`` pair a line; ``#`` comments and blank
lines allowed) or from ``$REFSIGHT_API_KEYS`` (the same pairs separated by commas,
semicolons or whitespace); one more key for the default namespace may come from
``--api-key`` or ``$REFSIGHT_API_KEY`` (llama-server's and vLLM's single key). A key mapped to the special namespace ``@operator`` may
read ``/metrics`` (whose counters span every tenant) and nothing else.

Keys are secrets: only their sha256 digests are kept in memory, they never appear
in an error message or a log line (a bad line is named by its number), and a
presented key is compared against *every* known digest with
:func:`hmac.compare_digest`, so the time taken says nothing about which key, or
which prefix, was close.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ...inputs.reading import FileReadError, read_regular_file
from ...inputs.text import is_valid_text
from ...support.environment import default_api_keys
from ...errors import InvalidInputError

__all__ = [
    "Tenants", "OPERATOR", "ENV_VAR", "is_loopback", "parse_key_pairs", "load_keys", "unserved_references_warning",
    "with_api_key",
]

#: Namespace of keys that may read operator-level data (``/metrics``) but no tenant's references.
OPERATOR = "@operator"
#: Environment variable holding ``key=namespace`` pairs.
ENV_VAR = "REFSIGHT_API_KEYS"

_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_MIN_KEY_CHARS = 8
log = logging.getLogger("refsight.server")
_MAX_KEYS_FILE_BYTES = 1 << 20


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def parse_key_pairs(text: str, *, source: str, lines: bool) -> dict[str, str]:
    """Parse ``key=namespace`` pairs; errors name ``source`` and the line or pair number, never the key."""
    pairs: dict[str, str] = {}
    items = text.splitlines() if lines else re.split(r"[\s,;]+", text)
    unit = "line" if lines else "pair"
    for number, raw in enumerate(items, 1):
        item = raw.split("#", 1)[0].strip() if lines else raw.strip()
        if not item:
            continue
        where = f"{source} {unit} {number}"
        key, namespace = _key_pair(item, where)
        if key in pairs:
            raise InvalidInputError(where, "this key is listed twice")
        pairs[key] = namespace
    return pairs


def _key_pair(item: str, where: str) -> tuple[str, str]:
    """``KEY=NAMESPACE`` checked: valid text, a key long enough and without spaces, a namespace's name."""
    if not is_valid_text(item):  # an environment variable can hold undecodable bytes
        raise InvalidInputError(where, "is not valid Unicode text")  # no position: it would say something of a key
    key, sep, namespace = item.rpartition("=")
    key, namespace = key.strip(), namespace.strip()
    if not sep or not key:
        raise InvalidInputError(where, "expected KEY=NAMESPACE")
    if len(key) < _MIN_KEY_CHARS or any(c.isspace() for c in key):
        raise InvalidInputError(where, f"a key has at least {_MIN_KEY_CHARS} characters and no spaces")
    if namespace != OPERATOR and not _NAMESPACE.fullmatch(namespace):
        raise InvalidInputError(
            where, f"namespace {namespace!r}: use 1-64 letters, digits, '.', '_' or '-', or {OPERATOR}"
        )
    return key, namespace


def with_api_key(keys: dict[str, str], key: str | None, source: str, namespace: str = "default") -> dict[str, str]:
    """``keys`` plus ``key`` for ``namespace`` (``--api-key``, ``$REFSIGHT_API_KEY``); errors name ``source``.

    As llama-server's ``--api-key``, ``key`` may list several keys, comma-separated, and a key may be short:
    a key under 8 characters is accepted with a warning (guessable; the key files still require 8).
    """
    if not key:
        return keys
    if not is_valid_text(key):
        raise InvalidInputError(source, "is not valid Unicode text")
    for one in (part.strip() for part in key.split(",")):
        if not one or any(c.isspace() for c in one):
            raise InvalidInputError(source, "a key is not empty and has no spaces")
        if len(one) < _MIN_KEY_CHARS:
            # Never the key itself in the log: only its length.
            log.warning("refsight: %s holds a key of %d characters: short keys are easy to guess", source, len(one))
        if keys.get(one, namespace) != namespace:
            raise InvalidInputError(source, "this key is also in the key pairs, for another namespace")
        keys = {**keys, one: namespace}
    return keys


def load_keys(path: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Keys from ``path`` if given, else from ``$REFSIGHT_API_KEYS``; ``{}`` when neither is set."""
    if path is not None:
        label = f"keys file {os.fspath(path)}"
        try:
            # A regular file of sane size only: a FIFO or /dev/zero must not hang or fill memory.
            text = read_regular_file(path, _MAX_KEYS_FILE_BYTES).decode("utf-8")
        except FileReadError as e:
            raise InvalidInputError(label, f"cannot read: {e.reason}") from None
        except UnicodeDecodeError:
            raise InvalidInputError(label, "not UTF-8 text") from None
        keys = parse_key_pairs(text, source=label, lines=True)
        if not keys:
            raise InvalidInputError(label, "holds no KEY=NAMESPACE lines")
        return keys
    env = environ.get(ENV_VAR, "") if environ is not None else default_api_keys()
    return parse_key_pairs(env, source=f"${ENV_VAR}", lines=False) if env.strip() else {}


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class _Entry:
    digest: bytes
    namespace: str


class Tenants:
    """Resolves a presented API key to its namespace in constant time over the key set."""

    def __init__(self, keys: Mapping[str, str] | None = None, *, default_namespace: str = "default") -> None:
        self._entries = tuple(_Entry(_digest(k), ns) for k, ns in (keys or {}).items())
        self.default_namespace = default_namespace

    @property
    def enabled(self) -> bool:
        """True when keys are configured (every request must then carry one)."""
        return bool(self._entries)

    @property
    def namespaces(self) -> list[str]:
        """The tenant namespaces (without the operator pseudo-namespace)."""
        return sorted({e.namespace for e in self._entries if e.namespace != OPERATOR})

    def resolve(self, presented: str | None) -> str | None:
        """The namespace of ``presented``, or None when it matches no key.

        Without configured keys every request belongs to the default namespace.
        """
        if not self._entries:
            return self.default_namespace
        if not presented:
            return None
        digest = _digest(presented)
        found: str | None = None
        # No early exit: every digest is compared, so timing does not reveal the position of a match.
        for entry in self._entries:
            if hmac.compare_digest(digest, entry.digest):
                found = entry.namespace
        return found

    def __repr__(self) -> str:  # never show digests either
        return f"Tenants({len(self._entries)} keys)"


def unserved_references_warning(service: Any, tenants: Tenants) -> str | None:
    """The start-up warning when keys are on and some references are in namespaces no key maps to.

    Without keys the server serves the default namespace, where the CLI adds references without
    ``--namespace``; turning keys on hides them unless a key maps to it. No request could ever see
    such references, so the operator hears of it once, at start-up (None when every one is served).
    """
    if not tenants.enabled:
        return None
    total = service.reference_count()
    served = sum(service.reference_count(namespace=namespace) for namespace in tenants.namespaces)
    if total <= served:
        return None
    message = f"refsight: {total - served} reference(s) exist only in namespaces no key maps to: no request can see them"
    default = tenants.default_namespace
    if default not in tenants.namespaces:
        in_default = service.reference_count(namespace=default)
        if in_default:
            message += (f"; {in_default} in {default!r}, where the CLI adds references without --namespace "
                        f"(map a key to it, KEY={default}, to serve them)")
    return message
