"""The thumbnail cache: JPEG thumbnails of reference images, kept per tenant when tenants are isolated.

A thumbnail costs a decode, a resize and a JPEG encode (milliseconds); a cached one costs
a dictionary look-up. Keyed by image hash and size alone, one tenant's fetch would make
another tenant's fetch of the same image fast, and the difference in time tells the second
tenant that someone holds that image (issue 25: 1.6 ms against 5.2 ms). So every entry is
keyed by a *scope* as well: the tenant's namespace when tenants are isolated, ``None`` when
they share packages (``refsight serve --share-packages``, or a server without keys), exactly
like the package keys of :class:`refsight.Engine`.

A miss must not cost what the whole image costs (issue 38: 8 concurrent thumbnails of a
40-megapixel reference took 5.5 GB). So sizes snap to :data:`SIZES` (a handful of entries per
image, whatever ``?size=`` says), identical concurrent misses wait for one render, at most
``max_renders`` renders run at once, and a render decodes through Pillow's draft mode (a JPEG
is decoded at 1/2 to 1/8 scale) before the resize (:func:`render_thumbnail`).
"""

from __future__ import annotations

import io
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable

from PIL import Image, ImageOps

from ... import ImageError
from ...inputs.images import IntakeLimits

__all__ = ["ThumbnailCache", "SIZES", "snap_size", "render_thumbnail"]

#: The thumbnail sizes served (longest side); a requested size snaps to the next one up.
SIZES = (32, 64, 128, 256, 512, 1024)


def snap_size(size: int) -> int:
    """The smallest of :data:`SIZES` at least ``size`` (the largest for anything above it)."""
    return next((s for s in SIZES if s >= size), SIZES[-1])


def render_thumbnail(data: bytes, size: int, limits: IntakeLimits, label: str) -> bytes:
    """A JPEG thumbnail (longest side ``size``) of kept image bytes, decoded at reduced scale where the format allows."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data)) as img:
                width, height = img.size
                if width * height > limits.max_pixels:
                    raise ImageError(label, f"{width}x{height} pixels, over the {limits.max_pixels}-pixel limit")
                img.seek(0)
                # thumbnail() on an image not yet loaded asks for draft mode first (JPEG: a scaled decode),
                # then reduces by whole factors before the final resample.
                img.thumbnail((size, size), reducing_gap=2.0)
                small = ImageOps.exif_transpose(img) or img
                small = small.convert("RGB")
        except ImageError:
            raise
        except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as e:
            raise ImageError(label, f"cannot decode the kept image: {e}") from None
    buffer = io.BytesIO()
    small.save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


class ThumbnailCache:
    """At most ``max_entries`` thumbnails by ``(scope, image hash, size)``, least recently used evicted first."""

    def __init__(self, max_entries: int = 1024, max_renders: int = 2) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str | None, str, int], bytes] = OrderedDict()
        self._lock = threading.Lock()
        #: Renders in progress by key: a second miss of the same key waits for the first one's result.
        self._inflight: dict[tuple[str | None, str, int], threading.Event] = {}
        self._renders = threading.BoundedSemaphore(max_renders)
        #: Thumbnails rendered (misses) and served from the cache (hits) by this process.
        self.renders = 0
        self.hits = 0

    def get(self, scope: str | None, image_sha256: str, size: int, render: Callable[[], bytes]) -> bytes:
        """The thumbnail under ``scope``; ``render()`` makes it on a miss (outside the lock, at most
        ``max_renders`` at once; concurrent misses of one key share one render)."""
        key = (scope, image_sha256, size)
        while True:
            with self._lock:
                data = self._entries.get(key)
                if data is not None:
                    self._entries.move_to_end(key)
                    self.hits += 1
                    return data
                waiting = self._inflight.get(key)
                if waiting is None:
                    done = self._inflight[key] = threading.Event()
                    break
            # Another request renders this key: wait, then read its entry (or render ourselves if it failed).
            waiting.wait()
        try:
            with self._renders:
                data = render()
            with self._lock:
                self.renders += 1
                self._entries[key] = data
                self._entries.move_to_end(key)
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
            return data
        finally:
            with self._lock:
                del self._inflight[key]
            done.set()
