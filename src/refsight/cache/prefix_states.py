"""The engine's prefix-state cache: the store's tiers behind the backends' :class:`PrefixCache` protocol.

One place counts, as :class:`~refsight.cache.packages.PackageCache` does for packages:
``prefix_hits`` (a state served, memory or disk), ``prefix_misses`` (none usable: the
backend builds it), ``prefix_ms_saved`` (the build time of every state served), ``prefix_tokens_reused`` (its
prompt tokens, which no prefill ran over) and ``prefix_corrupt`` (files found corrupt, deleted and so rebuilt). Counts go to the
store's :class:`~refsight.store.counters.CounterBuffer` (reads never write SQL).

The engine hands :attr:`Engine.prefixes <refsight.Engine>` to a backend on each request
(``GenerationRequest.prefix_cache``, set by :meth:`PrefixStateCache.for_request` from the request
context) unless the caller opted out (``prefix_states=False``, ``--no-prefix-states``) or sends pixels
(``use_cache=False``). States are keyed by the references' *package* keys, so when tenants do not
share packages (``share_packages=False``) they share no states either.
"""

from __future__ import annotations

import logging
from typing import Any

from ..backends.prefix import PrefixState
from ..context import RequestContext
from ..store import Store
from ..store.prefixes import PrefixStore

__all__ = ["PrefixStateCache"]

_log = logging.getLogger(__name__)


class PrefixStateCache:
    """:class:`~refsight.backends.prefix.PrefixCache` over ``store.prefixes``, counted in ``store.counters``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.states: PrefixStore = store.prefixes

    def for_request(self, context: RequestContext) -> PrefixStateCache | None:
        """What a request's ``GenerationRequest.prefix_cache`` is: this cache, or None when the context opts out."""
        return self if context.prefix_states else None

    def get(self, key: str) -> PrefixState | None:
        """The stored state (a hit: its build time counts as saved), or None (a miss)."""
        found = self.states.get(key)
        if found is None:
            self.store.counters.add(prefix_misses=1)
            return None
        self.store.counters.add(prefix_hits=1, prefix_ms_saved=found.build_ms, prefix_tokens_reused=found.tokens)
        return PrefixState(tensors=found.tensors, meta=dict(found.meta), tokens=found.tokens, build_ms=found.build_ms)

    def put(self, key: str, state: PrefixState) -> None:
        """Keep ``state``; a store failure (full disk ...) is logged, never raised: the answer is already computed."""
        try:
            self.states.put(key, state.tensors, meta=state.meta, tokens=state.tokens, build_ms=state.build_ms)
        except Exception as exc:  # noqa: BLE001 - a cache that cannot write must not fail the request
            _log.warning("prefix state %s not stored: %s: %s", key[:12], type(exc).__name__, exc)

    def discard(self, key: str) -> None:
        """Drop a state the backend could not use (it rebuilds it)."""
        self.states.delete(key)
        self.store.counters.add(prefix_corrupt=1)

    def stats(self) -> dict[str, Any]:
        """Files, bytes on disk and bytes in memory."""
        return self.states.stats()
