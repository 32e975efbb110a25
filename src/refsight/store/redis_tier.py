"""The optional Redis tier: packages shared by every process (and replica) in front of the disk.

Tier order is process memory → Redis → disk → encode (:class:`~refsight.store.TieredPackageStore`).
Redis is a cache, never the truth:

- **Values check themselves** (:mod:`refsight.store._packed`: magic, xxh3-128, a header that must
  derive the very key it was read under). A value that fails is a miss, deleted, never served.
- **Size is Redis's business**: run it with ``maxmemory`` and ``maxmemory-policy allkeys-lru``. A
  package Redis evicted is simply a miss, served from the disk tier (and written back), or
  re-encoded from the kept image when the disk no longer has it either.
- **An outage costs one short timeout, then nothing**: sockets time out after
  ``socket_timeout`` seconds; after a failure the tier is skipped (every call a miss, no
  network) for a back-off that doubles from ``min_backoff_s`` to ``max_backoff_s``; then ONE
  call probes, and on success the tier is used again (and refills as packages are read).
  Requests never fail because of Redis; errors are counted and logged once per outage. The
  back-off is the bucket's too: one :class:`~refsight.vllm_connector.refsight_breaker.Breaker`.
- Keys are content-addressed, so a value that outlived a delete during an outage still holds
  exactly the package its key names.

Needs Redis >= 7 and the ``redis`` client (``pip install 'refsight[redis]'``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

from ..errors import CorruptPackageError, InvalidInputError, StoreError
from ..support.extras import install_command
from ..package import VisualPackage
from ..vllm_connector.refsight_breaker import Breaker
from ._packed import pack, raw_size, unpack
from .base import PackageStore

__all__ = ["RedisPackageStore", "KEY_PREFIX", "MIN_REDIS_MAJOR", "redacted_url"]

log = logging.getLogger("refsight.store.redis")

#: Every value's Redis key is this prefix + the package key (the digit is the value layout).
KEY_PREFIX = "refsight:pkg:1:"
MIN_REDIS_MAJOR = 7
_SCHEMES = ("redis", "rediss", "unix")
_SKIPPED = object()  # the tier is backing off: no call was made
_FAILED = object()  # the call failed


def redacted_url(url: str) -> str:
    """``url`` without its password (safe for logs, errors and ``stats``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


class RedisPackageStore(PackageStore):
    """Packages as checksummed values in Redis; never raises for an unreachable or failing server."""

    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        socket_timeout: float = 0.25,
        min_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(url, str) or urlsplit(url).scheme not in _SCHEMES:
            raise InvalidInputError(f"cache {url!r}", "use a Redis URL: redis://HOST:PORT/DB, rediss://… or unix://PATH")
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:
            raise StoreError(f"the Redis cache tier needs the redis client: {install_command('redis')} ({exc})") from None
        self._redis = redis
        self.url = redacted_url(url)
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            # No client-side retries: one failure starts the tier's own back-off instead.
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
        )
        self.breaker = Breaker(f"Redis cache {self.url}", logger=log, meanwhile="serving from disk",
                               min_backoff_s=min_backoff_s, max_backoff_s=max_backoff_s, clock=clock)
        self._lock = threading.Lock()
        self._checked = False  # server version looked at (on the first successful contact)
        self.disabled: str | None = None  # why the tier is off for good (an old server)
        self.server: dict[str, Any] = {}
        # bytes_written: the values' bytes (compressed); raw_bytes_written: their package files' bytes before compression
        self.counts = {"writes": 0, "bytes_written": 0, "raw_bytes_written": 0, "corrupt": 0}
        # At open, an old server is a configuration error worth failing for; an unreachable one
        # is an outage like any other (the tier starts backing off and serves nothing meanwhile).
        if self._call(lambda c: c.ping()) is True and self.disabled:
            raise StoreError(self.disabled)

    # -- health -------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        """Whether the tier is in use now (not backing off after a failure, not disabled)."""
        return self.disabled is None and self.breaker.available

    def _reached(self) -> None:
        """Redis answered: healthy; on the first contact, look at the server once."""
        self.breaker.succeeded()
        with self._lock:
            check, self._checked = not self._checked, True
        if check:
            self._check_server()

    def _check_server(self) -> None:
        try:
            info = self._client.info("server")
            version = str(info.get("redis_version", "0"))
            self.server = {"version": version}
            try:
                policy = self._client.config_get("maxmemory-policy").get("maxmemory-policy")
            except self._redis.exceptions.ResponseError:
                policy = None  # CONFIG is often disabled on managed Redis: not our business then
            self.server["maxmemory_policy"] = policy
        except Exception as exc:  # noqa: BLE001 - as in _call: the tier never raises to its callers
            with self._lock:
                self._checked = False  # look again on the next successful contact
            self.breaker.failed(exc)
            return
        if int(version.split(".")[0] or 0) < MIN_REDIS_MAJOR:
            self.disabled = f"Redis cache {self.url} runs Redis {version}; refsight needs Redis >= {MIN_REDIS_MAJOR}"
            log.error("refsight: %s; the Redis tier is off", self.disabled)
        elif policy == "noeviction":
            log.warning("refsight: Redis cache %s has maxmemory-policy noeviction: once full it refuses new "
                        "packages; set maxmemory-policy allkeys-lru", self.url)

    def _call(self, operation: Callable[[Any], Any]) -> Any:
        if self.disabled is not None:
            self.breaker.skip()
            return _SKIPPED
        if not self.breaker.allow():
            return _SKIPPED
        try:
            result = operation(self._client)
        except self._redis.exceptions.ResponseError as exc:
            # The server answered (e.g. OOM under noeviction): not an outage, no back-off.
            self.breaker.refused()
            log.debug("refsight: Redis cache refused a command: %s", exc)
            return _FAILED
        except Exception as exc:  # noqa: BLE001 - whatever the client raises, the tier must not fail a request
            self.breaker.failed(exc)
            return _FAILED
        self._reached()
        return result

    # -- PackageStore ---------------------------------------------------------------------
    def get(self, key: str) -> VisualPackage | None:
        """The package, or None (absent, evicted, corrupt — then deleted — or Redis unavailable)."""
        value = self._call(lambda c: c.get(KEY_PREFIX + key))
        if value is _SKIPPED or value is _FAILED or value is None:
            return None
        try:
            return unpack(key, value)
        except CorruptPackageError as exc:
            with self._lock:
                self.counts["corrupt"] += 1
            log.warning("refsight: Redis cache value of %s is corrupt (%s): deleted", key, exc.reason)
            self._call(lambda c: c.delete(KEY_PREFIX + key))
            return None

    def put(self, package: VisualPackage) -> int:
        """Store the package (an existing value is replaced); returns the value's size, 0 when not stored."""
        if self.disabled is not None or not self.breaker.due():
            self.breaker.skip()
            return 0  # skip the packing too while Redis is away
        value = pack(package)
        if self._call(lambda c: c.set(KEY_PREFIX + package.key, value)) is not True:
            return 0
        with self._lock:
            self.counts["writes"] += 1
            self.counts["bytes_written"] += len(value)
            self.counts["raw_bytes_written"] += raw_size(value)
        return len(value)

    def contains(self, key: str) -> bool:
        """Whether Redis holds a value under ``key`` now (False when unavailable)."""
        return self._call(lambda c: c.exists(KEY_PREFIX + key)) == 1

    def delete(self, key: str) -> bool:
        """Drop the value of ``key``; True when one was removed."""
        return self._call(lambda c: c.delete(KEY_PREFIX + key)) == 1

    def keys(self) -> Iterator[str]:
        """Keys held now (a SCAN; empty when unavailable)."""
        found = self._call(lambda c: [k.decode()[len(KEY_PREFIX):] for k in c.scan_iter(match=KEY_PREFIX + "*", count=1000)])
        return iter(found if isinstance(found, list) else [])

    def tier_info(self) -> dict[str, Any]:
        """Per-process figures of this tier (writes, errors, skipped calls, corrupt values) and its state."""
        with self._lock:
            counts = dict(self.counts)
        return {**counts, **self.breaker.info(), "available": self.available, "url": self.url, **self.server,
                **({"disabled": self.disabled} if self.disabled else {})}

    def close(self) -> None:
        """Close the connections. Idempotent."""
        try:
            self._client.close()
        except Exception:  # noqa: BLE001 - closing a broken connection must not fail a shutdown
            pass
