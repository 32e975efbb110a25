"""vLLM's multimodal ``uuid``: the client's own cache key for an image it sends, per tenant.

In vLLM a content part with a payload and a ``uuid`` is that payload, remembered under the
uuid; a part with ``image_url: null`` and a ``uuid`` asks for what was sent before under it.
:class:`MediaUuids` keeps exactly that, scoped by the caller's namespace, so one tenant's
uuid never names another tenant's image. An entry is the decoded image itself, so it is
bound to its content: the same uuid sent with other pixels replaces the entry, and the
answer is always about the pixels of this request (the features come from the package
cache by pixel hash, never by uuid). Each use says which case it was (:data:`OUTCOMES`),
so a reply can tell the client.

The memory is bounded in bytes and in entries, least recently used first out; an evicted or
never-sent uuid is a miss that the caller turns into a 400. An entry's bytes are what it really
holds: decoded pixels, sent bytes, its key strings and a fixed :data:`ENTRY_OVERHEAD` for the
objects around them (the ImageInput, the PIL image, the OrderedDict node: about 1.7 KB measured
per tiny entry, issue 38), so a flood of tiny images under long uuids is bounded like big ones.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from ... import ImageInput
from ...results import FieldRecord

__all__ = ["MediaUuids", "UuidUse", "OUTCOMES", "MAX_UUID_CHARS", "ENTRY_OVERHEAD"]

#: What a uuid did in a request: a new entry, the same pixels again, other pixels than
#: before (the entry now holds these), a lookup served from the entry, or pixels answered
#: but not kept (larger than the whole memory: a later lookup misses).
OUTCOMES = ("stored", "unchanged", "replaced", "looked_up", "not_kept")
#: The longest uuid accepted (vLLM's are hashes or client ids; this bounds the memory a key costs).
MAX_UUID_CHARS = 256
#: Bytes an entry costs beyond its pixels, sent bytes and key text (Python objects, PIL's image
#: core, the index node), rounded up from the RSS measured per entry.
ENTRY_OVERHEAD = 2048


@dataclass(frozen=True)
class UuidUse(FieldRecord):
    """One use of a uuid in a request: the uuid and its outcome (one of :data:`OUTCOMES`); ``to_dict()``
    gives ``{"uuid": ..., "outcome": ...}``, as the reply shows it."""

    uuid: str
    outcome: str


def _cost(key: tuple[str, str], image: ImageInput) -> int:
    width, height = image.size  # never image.image: that would decode released pixels again
    # Keys are counted as UTF-8 (at most 4 bytes a character, as CPython stores at most).
    text = sum(len(part.encode("utf-8", "surrogatepass")) for part in key) + len(image.sha256)
    return width * height * 3 + len(image.source_bytes) + text + ENTRY_OVERHEAD


class MediaUuids:
    """Images by (namespace, uuid), LRU-bounded by ``max_bytes`` and ``max_entries``; thread-safe."""

    def __init__(self, max_bytes: int = 256 * 1024 * 1024, max_entries: int = 4096) -> None:
        self.max_bytes = int(max_bytes)
        self.max_entries = int(max_entries)
        self._entries: OrderedDict[tuple[str, str], ImageInput] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def remember(self, namespace: str, uuid: str, image: ImageInput) -> UuidUse:
        """Keep ``image`` under ``uuid`` for ``namespace``; whether it was new, the same, or replaced."""
        key = (namespace, uuid)
        with self._lock:
            before = self._entries.pop(key, None)
            if before is not None:
                self._bytes -= _cost(key, before)
            if _cost(key, image) > self.max_bytes:
                return UuidUse(uuid, "not_kept")
            outcome = "stored" if before is None else "unchanged" if before.sha256 == image.sha256 else "replaced"
            self._entries[key] = image
            self._bytes += _cost(key, image)
            self._evict()
        return UuidUse(uuid, outcome)

    def lookup(self, namespace: str, uuid: str) -> ImageInput | None:
        """The image sent under ``uuid`` by ``namespace``, or None (never sent, or evicted)."""
        with self._lock:
            image = self._entries.get((namespace, uuid))
            if image is not None:
                self._entries.move_to_end((namespace, uuid))
            return image

    def _evict(self) -> None:
        while (self._bytes > self.max_bytes or len(self._entries) > self.max_entries) and self._entries:
            key, image = self._entries.popitem(last=False)
            self._bytes -= _cost(key, image)

    @property
    def bytes(self) -> int:
        """The bytes the entries cost now (see :func:`_cost`)."""
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
