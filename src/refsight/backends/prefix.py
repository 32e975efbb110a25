"""The reference-prefix state cache as a backend sees it: a key, a state, and get / put.

A judge or ``generate`` prompt opens with the references (chat template start, preamble,
each reference image and its label), then the rubric or question. Everything up to the
last reference depends only on the references, so the language model's attention state
after that prefix (its past key/values; for llama.cpp the sequence state blob) can be
computed once and reused by every later request over the same references.

This module is the whole contract between a backend and the store that keeps those
states (the engine hands a :class:`PrefixCache` to the backend on each request; backends
never import the store):

- :func:`prefix_key` derives the key from the model fingerprint, the ordered package keys
  of the references, the exact prefix token ids and the backend's template / state version.
  Anything else in a request (rubric, candidate, sampling) is outside the prefix, so it may
  differ between two requests that share a state; anything in the key that differs is a
  miss, never a wrong state.
- :class:`PrefixState` is what is kept: named tensors (an HF cache: ``key.{layer}`` and
  ``value.{layer}`` per layer; llama.cpp: one ``uint8`` tensor ``state``), JSON metadata,
  the token count and what building it cost.
- :class:`PrefixCache` is the protocol: ``get(key)`` returns a state or None (a miss, also
  when a stored copy was corrupt: the store drops it), ``put(key, state)`` keeps one,
  ``discard(key)`` drops one a backend found unusable. Hits, misses and the time saved are
  counted by the implementation, once.

States are shared between requests and processes: a backend must copy before it mutates
(copy-on-use) and must treat every tensor it got as read-only.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from ..package import framed_sha256

__all__ = [
    "PREFIX_FORMAT_VERSION", "PREFIX_END", "PrefixState", "PrefixCache", "prefix_key", "token_digest", "reusable_prefix",
    "render_prefix",
]

#: Bumped whenever the meaning of a stored prefix state changes; part of every key.
PREFIX_FORMAT_VERSION = 1
#: Stands where the rest of the prompt begins when a prefix alone is rendered (user text cannot hold NUL).
PREFIX_END = "\x00refsight:prefix-end\x00"


@dataclass(frozen=True)
class PrefixState:
    """A language model's state after a prompt prefix.

    ``tensors`` are torch tensors on the CPU, or bytes-like objects (a llama.cpp sequence state),
    stored as a ``uint8`` tensor: :meth:`PrefixCache.get` always returns torch tensors (a blob
    comes back as ``uint8``: ``bytes(t.numpy())``); ``meta`` is JSON-ready (the backend's own layout facts: layers, heads ...);
    ``tokens`` the prefix length in tokens; ``build_ms`` what computing it cost (counted as
    saved on every hit).
    """

    tensors: Mapping[str, Any]
    meta: Mapping[str, Any] = field(default_factory=dict)
    tokens: int = 0
    build_ms: float = 0.0

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data."""
        total = 0
        for t in self.tensors.values():
            total += t.numel() * t.element_size() if hasattr(t, "element_size") else len(memoryview(t).cast("B"))
        return total


@runtime_checkable
class PrefixCache(Protocol):
    """Where prefix states are kept (the engine's store implements it; see :mod:`refsight.cache.prefix_states`)."""

    def get(self, key: str) -> PrefixState | None:
        """The state under ``key`` (counted as a hit), or None (counted as a miss)."""

    def put(self, key: str, state: PrefixState) -> None:
        """Keep ``state`` under ``key`` (memory, then disk); a failure to store never fails the request."""

    def discard(self, key: str) -> None:
        """Drop the state under ``key`` everywhere (the backend found it unusable)."""


def token_digest(token_ids: Sequence[int]) -> str:
    """sha256 of the token ids as little-endian int64 (the length is part of the key separately)."""
    ids = [int(t) for t in token_ids]
    return hashlib.sha256(struct.pack(f"<{len(ids)}q", *ids)).hexdigest()


def prefix_key(model: str, package_keys: Sequence[str], token_ids: Sequence[int], template: str) -> str:
    """The key of a prefix state.

    ``model`` names the language model's numbers exactly (the backend's fingerprint digest
    plus what else changes them, e.g. the device); ``package_keys`` are the references'
    package keys in prompt order (already salted by a tenant's scope when packages are
    isolated, so states are too); ``token_ids`` the exact prefix token ids; ``template`` the
    backend's template and state-layout version. Fields are length-prefixed, so no choice
    of strings makes two different inputs hash alike.
    """
    for name, value in (("model", model), ("template", template)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"prefix_key: {name} must be a non-empty string")
    keys = [str(k) for k in package_keys]
    ids = [int(t) for t in token_ids]
    if not ids:
        raise ValueError("prefix_key: an empty prefix has no state")
    parts = [
        ("format", str(PREFIX_FORMAT_VERSION)),
        ("model", model),
        ("packages", json.dumps(keys, separators=(",", ":"))),
        ("tokens", f"{len(ids)}:{token_digest(ids)}"),
        ("template", template),
    ]
    return framed_sha256(parts)


def reusable_prefix(segments: Sequence[Any], is_reference: Any) -> int:
    """How many leading ``segments`` form a reusable reference prefix (0: none).

    The prefix runs through the last reference that is preceded only by text and other
    references; ``is_reference(segment)`` says which segments are references. A fresh
    image (a candidate) before any reference ends the prefix there.
    """
    end = 0
    for i, segment in enumerate(segments):
        if isinstance(segment, str):
            continue
        if not is_reference(segment):
            break
        end = i + 1
    return end


def render_prefix(
    render: Callable[[list[Any], list[tuple[str, int]] | None], str],
    segments: Sequence[Any],
    turns: Sequence[tuple[str, int]] | None,
    n_segments: int,
) -> str | None:
    """The prompt text up to the end of the first ``n_segments`` segments, as the chat template writes it.

    ``render(segments, turns)`` is the backend's prompt renderer. The head is rendered with
    :data:`PREFIX_END` standing where the rest begins (inside the turn that holds the head's
    last segment), so the text before it is exactly what the template writes before the
    rest, whatever the rest is; None when the template dropped the marker.
    """
    cut_turns = None
    if turns is not None:
        cut_turns, start = [], 0
        for role, count in turns:
            if start + count >= n_segments:
                cut_turns.append((role, n_segments - start + 1))  # the head's last turn, cut after it
                break
            cut_turns.append((role, count))
            start += count
    text = render([*segments[:n_segments], PREFIX_END], cut_turns)
    cut = text.find(PREFIX_END)
    return None if cut < 0 else text[:cut]
