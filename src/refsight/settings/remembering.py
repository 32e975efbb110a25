"""Remembered images: the inline images a tenant sends again, kept by the store (the ``remember_images`` policy).

An unchanged client (the ``ollama`` library, an OpenAI SDK, a llama-server script) sends the same reference
photos inline (base64, a data URL, an allowed remote URL) in every request; it never names a stored
reference. Such an image is a *candidate* unless the policy keeps it, and a candidate lives in the memory
tier only, so after a restart every one is encoded again. The policy is one setting:

- ``off``: every inline image stays a candidate; nothing about it reaches the disk, ever;
- ``recurring`` (the default): an image a namespace sends in a *second* request is *remembered*: its
  package goes to the store (every tier, under the byte quota and its least-recently-used order; the
  features and the fingerprint, never the image bytes) with a row naming the namespace
  (:mod:`refsight.store.remembered`), and from then on the prompt's reference prefix runs through it, so
  its prefix state is kept as a named reference's is. The next request, after a restart or on another
  replica of the shared store, encodes only what is new. An image sent once leaves nothing on disk: the
  sightings are counted in memory only (:class:`Sightings`, bounded, forgotten at exit), so an image is
  remembered once one process saw it twice (a replica that saw it once and another that saw it once
  remember nothing);
- ``all``: every inline image is remembered at its first sighting.

**Privacy.** A remembered image's package is derived from the image: features a vision encoder computed
from its pixels, from which a model can say what the image shows. It stays in the store until the quota
evicts it or it is forgotten (``refsight prune --remembered``, ``DELETE /v1/remembered``); with tenants
isolated it is salted by the namespace as every package is, and listed only to that namespace. A server
that must keep nothing a client sends runs ``--remember-images off``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ..support.environment import default_remember_images
from ..errors import InvalidInputError

__all__ = [
    "REMEMBER_IMAGES", "DEFAULT_REMEMBER_IMAGES", "MAX_SIGHTINGS", "Sightings", "check_remember_images",
    "remember_images_setting",
]

#: The policy's values: nothing kept, images sent in a second request kept, every inline image kept.
REMEMBER_IMAGES = ("off", "recurring", "all")
DEFAULT_REMEMBER_IMAGES = "recurring"
#: Inline images one process remembers having seen (namespace and package key, about 250 bytes each).
MAX_SIGHTINGS = 16384


def check_remember_images(value: object, name: str = "remember_images") -> str:
    """``value`` when it is one of :data:`REMEMBER_IMAGES`, else InvalidInputError naming ``name``."""
    if not isinstance(value, str) or value not in REMEMBER_IMAGES:
        raise InvalidInputError(name, f"must be one of {', '.join(REMEMBER_IMAGES)}, not {value!r}")
    return value


def remember_images_setting(explicit: str | None, configured: str | None) -> str:
    """The policy in force: ``explicit`` (a flag, a keyword), else ``$REFSIGHT_REMEMBER_IMAGES``, else
    ``configured`` (the config file's ``[store] remember_images``, checked as it was read), else
    :data:`DEFAULT_REMEMBER_IMAGES`; a bad value names its source."""
    if explicit is not None:
        return check_remember_images(explicit)
    environment = default_remember_images()
    if environment is not None:
        return check_remember_images(environment, "$REFSIGHT_REMEMBER_IMAGES")
    return configured if configured is not None else DEFAULT_REMEMBER_IMAGES


class Sightings:
    """How many requests of each namespace sent each inline image, in this process: memory only, bounded
    (the least recently sighted forgotten first), so an image sent once leaves nothing anywhere but here."""

    def __init__(self, limit: int = MAX_SIGHTINGS) -> None:
        self.limit = limit
        self._seen: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._lock = threading.Lock()

    def note(self, namespace: str, package_key: str) -> int:
        """Count one request's sighting of the image of ``package_key`` (once per request); the requests that
        sent it so far, this one included (at most 2: "again" is all the policy asks)."""
        entry = (namespace, package_key)
        with self._lock:
            count = min(self._seen.pop(entry, 0) + 1, 2)
            self._seen[entry] = count
            while len(self._seen) > self.limit:
                self._seen.popitem(last=False)
        return count

    def __len__(self) -> int:
        return len(self._seen)
