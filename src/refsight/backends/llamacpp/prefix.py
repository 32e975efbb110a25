"""The KV prefix cache of the llama.cpp backend: the reference prefix's sequence state, saved and restored.

A judge prompt opens with everything that depends only on the references (chat
template start, preamble, each reference image and its text). :class:`PromptPrefix`
finds that opening in the tokenized prompt (:meth:`PromptPrefix.split`: the chunks mtmd
lays out for the rendered prefix alone must be an exact prefix of the prompt's
chunks, text tokens and image layouts alike; otherwise nothing is reused; the state ends
at the last chunk boundary inside the prefix, so every chunk after it is evaluated whole,
in the batch the plain path gives it), keys it
(model fingerprint, ordered package keys, the exact prefix tokens, the template and
state versions, the context settings that change the numbers), and either restores
the saved state with ``llama_state_seq_set_data`` (the references are then neither
decoded nor prefilled) or lets the prompt evaluate the prefix and saves
``llama_state_seq_get_data`` of it (one uint8 tensor) for the next request.

States live in the request's :class:`~refsight.backends.prefix.PrefixCache` (the
shared prefix-state store: memory LRU and checksummed disk tier) as a
:class:`~refsight.backends.prefix.PrefixState` with one ``uint8`` tensor ``state``; a
state whose metadata disagrees or that llama.cpp refuses is discarded and rebuilt,
never used.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ...families import FAMILIES
from ...inputs.images import ImageInput
from ...package import VisualPackage
from ..prefix import PrefixCache, PrefixState, prefix_key, render_prefix
from .logs import repack_weights
from .native import ChunkInfo, LlamaRuntime, NativeError

__all__ = ["PREFIX_STATE_VERSION", "WINDOW_BOUND_ARCHITECTURES", "PromptPrefix", "PrefixSplit", "plan_prefix", "prefix_tokens"]

#: Version of the llama.cpp state layout (one ``llama_state_seq_get_data`` blob); part of every key.
PREFIX_STATE_VERSION = 2  # 2: a state ends at a chunk boundary (1 could end inside a text chunk)
#: Architectures whose saved state continues as the plain path only while the prefix fits in the sliding
#: window. ``llama_state_seq_get_data`` leaves out the cells the window has passed; on Gemma 4 (whose
#: sliding layers attend both ways inside an image) the prompt then continues otherwise than the plain
#: path: measured on tiny-gemma4-gguf, logits off by up to 0.73 and a changed greedy token with the prefix
#: past the window, bit-identical within it. Gemma 3 (causal sliding layers) is bit-identical either way.
#: Read off the family entries (``llamacpp.window_bound``, keyed by the GGUF architecture).
WINDOW_BOUND_ARCHITECTURES = frozenset(f.llamacpp.architecture for f in FAMILIES.values() if f.llamacpp.window_bound)


@dataclass(frozen=True)
class PrefixSplit:
    """Where the prefix state ends in a prompt: after all of ``chunks[:chunk]``."""

    chunk: int
    n_past: int
    tokens: tuple[int, ...]
    key: str


def prefix_tokens(infos: Sequence[ChunkInfo]) -> list[int]:
    """The prefix as one id list: text tokens as they are, each image chunk as ``-1, n_tokens, n_pos, nx, ny``.

    Image chunks carry no token ids; their content is named by the package keys in the key.
    """
    out: list[int] = []
    for info in infos:
        out += list(info.tokens) if info.kind == "text" else [-1, info.n_tokens, info.n_pos, info.nx, info.ny]
    return out


@dataclass
class PromptPrefix:
    """One request's prefix: its rendered text, images and package keys, and what became of it.

    ``outcome`` is set by the prompt evaluation: ``"hit"`` (restored), ``"miss"``
    (evaluated and saved), ``"rebuilt"`` (a stored state was refused and rebuilt) or
    ``"none"`` (the prefix is not a token prefix of the prompt: nothing reused or saved).
    """

    text: str
    n_images: int
    package_keys: tuple[str, ...]
    states: PrefixCache
    model: str
    template: str
    outcome: str = "none"
    build_ms: float = 0.0
    restore_ms: float = 0.0
    prefix_tokens: int = 0
    _began: float = field(default=0.0, repr=False)

    def split(self, runtime: LlamaRuntime, infos: list[ChunkInfo], bitmaps: Sequence[Any]) -> PrefixSplit | None:
        """Where this prefix ends among the prompt's chunks, or None (nothing reused).

        None when the prefix is not an exact token prefix of the prompt, or when it reaches past the
        sliding window of a :data:`WINDOW_BOUND_ARCHITECTURES` model.
        """
        if self.n_images > len(bitmaps):
            return None
        with runtime.tokenized(self.text, list(bitmaps[: self.n_images])) as chunks:
            mine = [runtime.chunk_info(c) for c in chunks]
        chunk = _end_chunk(mine, infos)
        if chunk is None or not 0 < chunk < len(infos):
            return None  # nothing to reuse, or nothing would follow the prefix: no logits to continue from
        covered = list(infos[:chunk])
        tokens = prefix_tokens(covered)
        n_past = sum(i.n_pos for i in covered)
        if _past_the_window(runtime, n_past):
            return None  # the state would not continue as the plain path (WINDOW_BOUND_ARCHITECTURES)
        key = prefix_key(self.model, self.package_keys, tokens, f"llamacpp-state-{PREFIX_STATE_VERSION}:{self.template}")
        self.prefix_tokens = sum(i.n_tokens for i in covered)
        self._began = time.perf_counter()
        return PrefixSplit(chunk, n_past, tuple(tokens), key)

    def restore(self, runtime: LlamaRuntime, split: PrefixSplit, seq: int = 0) -> bool:
        """Load the stored state of ``split`` into cleared sequence ``seq``; False (evaluate it instead) on a miss."""
        began = time.perf_counter()  # the store's read (memory or disk) counts as loading too
        found = self.states.get(split.key)
        if found is None:
            self.outcome = "miss"
            return False
        meta = found.meta
        state = found.tensors.get("state")
        if (
            state is None or meta.get("n_past") != split.n_past or meta.get("runtime") != "llama.cpp"
            or list(meta.get("package_keys", ())) != list(self.package_keys) or found.tokens != self.prefix_tokens
        ):
            self.states.discard(split.key)  # a key collision or a tampered entry: never a wrong state
            self.outcome = "rebuilt"
            return False
        try:
            runtime.restore_state(_as_uint8(state), seq)
        except NativeError:
            self.states.discard(split.key)
            self.outcome = "rebuilt"
            return False
        self.outcome = "hit"
        self.restore_ms = (time.perf_counter() - began) * 1000
        return True

    def save(self, runtime: LlamaRuntime, split: PrefixSplit, seq: int = 0) -> None:
        """Offer the prefix state just evaluated into sequence ``seq`` to the store."""
        import torch

        self.build_ms = (time.perf_counter() - self._began) * 1000
        meta = {"runtime": "llama.cpp", "n_past": split.n_past, "package_keys": list(self.package_keys)}
        state = torch.from_numpy(runtime.state_bytes(seq))
        self.states.put(split.key, PrefixState({"state": state}, meta, tokens=self.prefix_tokens, build_ms=self.build_ms))


def plan_prefix(backend: Any, request: Any, template: str) -> PromptPrefix | None:
    """The :class:`PromptPrefix` of ``request``'s reference prefix on ``backend`` (a llama.cpp backend), its states
    keyed by ``template`` (what the chat template is known by), or None.

    None when there is nothing to reuse: no ``prefix_cache``, no ``prefix_segments``,
    or a prefix holding a fresh image (only cached packages have a stable identity to
    key a state by).
    """
    n_segments, states = request.prefix_segments, request.prefix_cache
    if states is None or not n_segments or n_segments >= len(request.segments):
        return None
    head = list(request.segments[:n_segments])
    if any(isinstance(s, ImageInput) for s in head) or not any(isinstance(s, VisualPackage) for s in head):
        return None
    render = partial(backend.prompt_text, tools=request.chat_tools, variables=request.template_variables)
    text = render_prefix(render, request.segments, request.turns, n_segments)
    if text is None:
        return None
    packages = [s for s in head if isinstance(s, VisualPackage)]
    return PromptPrefix(
        text=text,
        n_images=len(packages),
        package_keys=tuple(p.key for p in packages),
        states=states,
        model=f"{backend.fingerprint().digest}:{backend.device}:{_state_context(backend.runtime)}",
        template=hashlib.sha256(template.encode()).hexdigest(),
    )


def _state_context(runtime: LlamaRuntime) -> str:
    """What of the context a state's numbers depend on besides the model and the device: the batch split, the KV
    type, the attention kernel and the weights' kernels (repacked or not); llama.cpp writes the context's stream count
    into a state and loads it only there."""
    settings = runtime.settings
    # One stream and llama.cpp's default attention: the key states were always stored under.
    streams = f":streams={settings.n_seq}" if settings.n_seq > 1 else ""
    attention = f":fa={settings.flash_attn}" if settings.flash_attn != "auto" else ""
    weights = "" if repack_weights() else ":repack=off"
    return f"n_batch={runtime._n_batch()}:kv=f16{streams}{attention}{weights}"


def _past_the_window(runtime: LlamaRuntime, n_past: int) -> bool:
    """True when a :data:`WINDOW_BOUND_ARCHITECTURES` model's sliding window ends before ``n_past`` positions."""
    arch = runtime.meta("general.architecture")
    if arch not in WINDOW_BOUND_ARCHITECTURES:
        return False
    window = runtime.meta(f"{arch}.attention.sliding_window")
    return window is not None and 0 < int(window) < n_past


def _as_uint8(state: object) -> np.ndarray:
    """A stored state tensor (torch or numpy or bytes) as a contiguous uint8 numpy array."""
    if hasattr(state, "numpy"):
        return np.ascontiguousarray(state.detach().cpu().numpy()).view(np.uint8).reshape(-1)
    return np.frombuffer(memoryview(state).cast("B"), dtype=np.uint8)


def _end_chunk(mine: list[ChunkInfo], infos: list[ChunkInfo]) -> int | None:
    """How many of the prompt's chunks ``infos`` the prefix's chunks ``mine`` cover, or None when the prefix
    is not a token prefix of the prompt."""
    if not mine or len(mine) > len(infos):
        return None
    if any(a != b for a, b in zip(mine[:-1], infos)):
        return None
    last, there = mine[-1], infos[len(mine) - 1]
    if last == there:
        return len(mine)
    if last.kind == there.kind == "text" and there.tokens[: len(last.tokens)] == last.tokens:
        # The prefix ends inside a text chunk: the state stops before that chunk, which is then
        # evaluated whole, in the one batch the plain path gives it. llama.cpp's quantized CPU
        # kernels give a token other numbers in another batch (measured on the 28-layer Q4_K_M
        # GGUF: a split chunk moved the first logits by 0.13 and changed the greedy answer).
        return len(mine) - 1
    return None
