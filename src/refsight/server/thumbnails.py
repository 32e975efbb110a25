"""The thumbnail cache: JPEG thumbnails of reference images, kept per tenant when tenants are isolated.

A thumbnail costs a decode, a resize and a JPEG encode (milliseconds); a cached one costs
a dictionary look-up. Keyed by image hash and size alone, one tenant's fetch would make
another tenant's fetch of the same image fast, and the difference in time tells the second
tenant that someone holds that image (issue 25: 1.6 ms against 5.2 ms). So every entry is
keyed by a *scope* as well: the tenant's namespace when tenants are isolated, ``None`` when
they share encodes (``refsight serve --share-encodes``, or a server without keys), exactly
like the package keys of :class:`refsight.Engine`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["ThumbnailCache"]


class ThumbnailCache:
    """At most ``max_entries`` thumbnails by ``(scope, image hash, size)``, least recently used evicted first."""

    def __init__(self, max_entries: int = 1024) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str | None, str, int], bytes] = OrderedDict()
        self._lock = threading.Lock()
        #: Thumbnails rendered (misses) and served from the cache (hits) by this process.
        self.renders = 0
        self.hits = 0

    def get(self, scope: str | None, image_sha256: str, size: int, render: Callable[[], bytes]) -> bytes:
        """The thumbnail under ``scope``; ``render()`` makes it on a miss (outside the lock: renders run in parallel)."""
        key = (scope, image_sha256, size)
        with self._lock:
            data = self._entries.get(key)
            if data is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return data
        data = render()
        with self._lock:
            self.renders += 1
            self._entries[key] = data
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return data
