"""Reference-prefix state reuse for the transformers backends (every family whose template keeps the
references at the head of the prompt: sliding-window families such as Gemma 3 and Aya Vision, and
hybrid ones, Qwen3.5's Gated DeltaNet layers and Gemma 4's KV-shared layers, included).

For each row of a ``generate`` batch whose request marks a reference prefix
(``prefix_segments``) and carries a ``prefix_cache``:

1. **Cut.** The prompt is rendered twice: in full, and up to the end of the prefix (a
   marker segment stands where the suffix begins, so the chat template renders exactly the
   text that precedes it). Both are tokenized; the prefix counts only when its ids are the
   head of the full ids and hold exactly the image tokens of the prefix's packages (else,
   cut back to the end of the last reference's placeholder, whose closing special token is
   always a token boundary; else no reuse for that row).
2. **Key.** :func:`~refsight.backends.prefix.prefix_key` over the fingerprint digest and
   device, the prefix packages' keys, the prefix ids and :data:`TEMPLATE`.
3. **State.** ``get(key)``; on a miss the prefix alone is run through the model (batch 1,
   no padding, so a state never depends on which batch built it) and every layer's state
   (:mod:`.layer_states`: key/value tensors after RoPE; a linear layer's convolution and
   recurrent state) is ``put``. Each distinct prefix is built once per call, however many rows
   share it.
4. **Batch.** Every row becomes ``[pad][prefix][pad][suffix]``: the states are copied into
   one new ``DynamicCache`` (copy-on-use; left-padded with zeros that the attention mask
   hides), and ``model.generate`` prefills only the suffixes. Rows without a usable prefix
   put their whole prompt in the suffix part.

**Sliding-window layers** (``DynamicSlidingWindowLayer``: Gemma 3, Cohere 2's Aya Vision) keep
only the last ``window - 1`` tokens, and their mask counts distance in cache columns. A state
keeps the whole prefix for them too (built with past recording on), so a state is the same
layout for every layer; the batch's cache is filled through the layer's own ``update``, which
keeps the last columns and carries ``cumulative_length`` (the prefix width) exactly as a fresh
prefill of the same columns would. The padding between a short prefix and a short suffix is
not free there: it would push real tokens out of the window. So when some row could reach
past the window (its prefix, the widest suffix and the new tokens), the batch runs in parts
of rows with equal suffix length (:meth:`PrefixBatch.parts`), each part without padding
between prefix and suffix, which is the fresh path's layout. The windows are part of the key
(:func:`state_layout`).

**Linear-attention layers** (Gated DeltaNet: Qwen3.5, Qwen3.5-MoE, MiniCPM-V 4.6's language model)
keep a convolution state and a recurrent state instead of keys and values
(:mod:`.layer_states`). A recurrent state sums every token of the prefix in order, so it cannot
be cut or padded in the middle: a state is the prefix run alone, and the batch always runs in
parts of rows with equal suffix length, each row laid out as the plain path lays it out (left
padding before the prefix only, where the attention layers' mask hides it and the row's own
state stands for the linear layers). Which layers are linear is part of the key
(:func:`state_layout`). **KV-shared layers** (Gemma 4) keep nothing: they attend with what their
producer layer's own cache returns in the same forward.

Positions are the fresh path's, exactly: they are computed over the whole (padded) prompt
by the model's own ``_prepare_position_ids_for_generation`` (Qwen: M-RoPE with every image's
grid, ``[4, batch, seq]``; SmolVLM: plain positions from the mask) and handed to
``generate``, which slices them to the uncached part and extends them per new token. So the
stale ``rope_deltas`` a model object keeps from an earlier call never matter. Image
features of the suffix (the candidate) enter through ``mm_encoder_outputs`` as usual; for
Qwen3-VL the deepstack features are added at image positions only, which lie in the prefix
(built with them) or in the suffix (passed with them).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

from ...package import VisualPackage
from ...requests import GenerationRequest
from ..prefix import PrefixState, prefix_key, render_prefix
from .layer_states import expected_tensors, fill, layer_kinds, snapshot
from .runtime import to_device

__all__ = ["TEMPLATE", "PrefixBatch", "plan_prefixes", "state_layout", "usable_cache"]

#: The template and state layout version of HF prefix states (part of every key).
TEMPLATE = "hf-kv-1"


@dataclass
class _Row:
    ids: list[int]
    prefix_len: int = 0
    key: str | None = None
    packages: list[VisualPackage] = field(default_factory=list)  # every package of the row, in prompt order
    prefix_packages: int = 0  # how many of them lie in the prefix
    cache: Any = None  # the request's PrefixCache
    state: PrefixState | None = None
    hit: bool = False


@dataclass
class PrefixBatch:
    """The rows of one batch and their prefixes; :meth:`inputs` builds what ``generate`` takes."""

    backend: Any
    rows: list[_Row]
    #: Each language-model layer's kind (:func:`.layer_states.layer_kinds`).
    kinds: list[str]
    #: Time spent building missing states, and fetching stored ones plus copying them into the batch's cache.
    build_ms: float = 0.0
    load_ms: float = 0.0
    #: The states of this call by key, with whether each came from the cache: the parts of one batch
    #: share it, so each distinct prefix is looked up (or built) once per call.
    states: dict[str, tuple[PrefixState, bool]] = field(default_factory=dict)

    def parts(self, max_new_tokens: int) -> list[tuple[list[int], PrefixBatch]]:
        """The rows that run in one ``generate`` call each, with their plan: the whole batch, unless a
        sliding window could reach across the padding between a prefix and a suffix, or a linear layer's
        state would run through it (module docstring)."""
        windows = [w for w in _windows(self.backend) if w is not None]
        suffixes = [len(row.ids) - row.prefix_len for row in self.rows]
        widest = max(suffixes)
        linear = "linear" in self.kinds
        if not linear and (not windows or all(row.prefix_len + widest + max_new_tokens < min(windows) for row in self.rows)):
            return [(list(range(len(self.rows))), self)]
        groups: dict[int, list[int]] = {}
        for b, length in enumerate(suffixes):
            groups.setdefault(length, []).append(b)
        return [(rows, PrefixBatch(self.backend, [self.rows[b] for b in rows], self.kinds, states=self.states))
                for rows in groups.values()]

    def reused_tokens(self, b: int) -> int:
        """Prompt tokens of row ``b`` served from a stored state (0 when built in this call)."""
        row = self.rows[b]
        return row.prefix_len if row.hit else 0

    def inputs(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(encoded, extra)``: the padded ``input_ids`` / ``attention_mask`` and the ``generate`` kwargs
        (the copied cache, the positions, the suffix images' features). Builds missing states first."""
        import torch

        backend = self.backend
        began = time.perf_counter()
        self._resolve_states()
        pad = backend.pad_id()
        n_max = max(row.prefix_len for row in self.rows)
        s_max = max(len(row.ids) - row.prefix_len for row in self.rows)
        ids, mask = [], []
        for row in self.rows:
            n, s = row.prefix_len, len(row.ids) - row.prefix_len
            ids.append([pad] * (n_max - n) + row.ids[:n] + [pad] * (s_max - s) + row.ids[n:])
            mask.append([0] * (n_max - n) + [1] * n + [0] * (s_max - s) + [1] * s)
        device = backend.device
        input_ids = torch.tensor(ids, dtype=torch.long, device=device)
        attention_mask = torch.tensor(mask, dtype=torch.long, device=device)
        every = [p for row in self.rows for p in row.packages]
        suffix = [p for row in self.rows for p in row.packages[row.prefix_packages:]]
        extra: dict[str, Any] = {}
        position_kwargs: dict[str, Any] = {"attention_mask": attention_mask}
        if every:
            mm = to_device(backend.multimodal_inputs(every, input_ids), device)
            mm.pop("mm_encoder_outputs", None)
            position_kwargs.update(mm)
            extra.update(_token_types(mm))
        if suffix:
            extra["mm_encoder_outputs"] = to_device(
                backend.multimodal_inputs(suffix, input_ids)["mm_encoder_outputs"], device
            )
        # The fresh path's positions over the whole prompt (see the module docstring).
        extra["position_ids"] = backend.model._prepare_position_ids_for_generation(input_ids, position_kwargs)
        extra["cache"] = self._batched_cache(n_max)
        self.load_ms = (time.perf_counter() - began) * 1000 - self.build_ms
        return {"input_ids": input_ids, "attention_mask": attention_mask}, extra

    # -- states --------------------------------------------------------------------------
    def _resolve_states(self) -> None:
        for row in self.rows:
            if row.key is None:
                continue
            if row.key not in self.states:
                self.states[row.key] = self._state(row)
            row.state, row.hit = self.states[row.key]

    def _state(self, row: _Row) -> tuple[PrefixState, bool]:
        """The row's state from the cache (True), or built now and put (False)."""
        state = row.cache.get(row.key)
        if state is not None and not _fits(self.backend, self.kinds, state, row.prefix_len):
            row.cache.discard(row.key)
            state = None
        if state is not None:
            return state, True
        began = time.perf_counter()
        state = _build(self.backend, self.kinds, row)
        ms = (time.perf_counter() - began) * 1000
        state = PrefixState(state.tensors, state.meta, state.tokens, ms)
        self.build_ms += ms
        row.cache.put(row.key, state)
        return state, False

    def _batched_cache(self, n_max: int) -> Any:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.backend.model.config)
        states = [row.state if row.state is not None and row.prefix_len else None for row in self.rows]
        fill(cache, self.kinds, states, n_max, self.backend)
        return cache


def _fits(backend: Any, kinds: list[str], state: PrefixState, tokens: int) -> bool:
    """Whether a stored state has exactly the tensors, shapes and dtypes this model and prefix need (else it is rebuilt)."""
    want = expected_tensors(backend, kinds, tokens)
    if state.tokens != tokens or set(state.tensors) != set(want):
        return False
    return all(list(state.tensors[name].shape) == shape and state.tensors[name].dtype in dtypes
               for name, (shape, dtypes) in want.items())


def _token_types(mm: dict[str, Any]) -> dict[str, Any]:
    """The token type inputs among a backend's multimodal inputs (``mm_token_type_ids`` for M-RoPE,
    ``token_type_ids`` for Gemma 3's bidirectional image attention): the forward needs them too."""
    return {k: mm[k] for k in ("mm_token_type_ids", "token_type_ids") if k in mm}


def _build(backend: Any, kinds: list[str], row: _Row) -> PrefixState:
    """Run the prefix alone (batch 1) and keep every layer's state on the CPU (:func:`.layer_states.snapshot`)."""
    import torch
    from transformers import DynamicCache

    ids = torch.tensor([row.ids[: row.prefix_len]], dtype=torch.long, device=backend.device)
    mask = torch.ones_like(ids)
    packages = row.packages[: row.prefix_packages]
    mm = to_device(backend.multimodal_inputs(packages, ids), backend.device)
    encoder = mm.pop("mm_encoder_outputs")
    positions = backend.model._prepare_position_ids_for_generation(ids, {"attention_mask": mask, **mm})
    cache = DynamicCache(config=backend.model.config)
    for kind, layer in zip(kinds, cache.layers):
        if kind == "sliding":
            layer.activate_past_recording()  # keep the whole prefix: a batch may cut it anywhere (module docstring)
    # The base model (no LM head: the prefix's logits are never needed). The mask is all ones and
    # dropped, as generate drops it for an unpadded prompt.
    backend.model.model(
        input_ids=ids, position_ids=positions, cache=cache, use_cache=True, mm_encoder_outputs=encoder,
        **_token_types(mm),
    )
    meta = {"layers": len(kinds), "kinds": ",".join(kinds), "dtype": str(backend.model.dtype).removeprefix("torch.")}
    return PrefixState(tensors=snapshot(cache, kinds), meta=meta, tokens=row.prefix_len)


def usable_cache(backend: Any) -> bool:
    """Whether a state after the references can stand for them (the family's attention allows it:
    :attr:`~refsight.families.entry.Traits.no_prefix`) and every language-model layer's state can be kept and put
    back (:func:`.layer_states.layer_kinds`: full attention, sliding windows, Gated DeltaNet)."""
    return not backend.traits.no_prefix and layer_kinds(backend) is not None


def _windows(backend: Any) -> list[int | None]:
    """Each language-model layer's sliding window (None: full attention), as its cache sees it."""
    from transformers import DynamicCache

    cache = DynamicCache(config=backend.model.config)
    return [int(layer.sliding_window) if getattr(layer, "is_sliding", False) else None for layer in cache.layers]


def state_layout(backend: Any) -> str:
    """What of the language model's layer shapes a state beyond the fingerprint: the sliding windows
    and which layers are linear (empty for full attention only, so those keys stay as they were)."""
    windows = _windows(backend)
    layout = ""
    if any(w is not None for w in windows):
        layout += ":windows=" + ",".join("full" if w is None else str(w) for w in windows)
    kinds = layer_kinds(backend) or []
    if "linear" in kinds:
        layout += ":linear=" + ",".join(str(i) for i, kind in enumerate(kinds) if kind == "linear")
    return layout


def _prefix_text(backend: Any, row: list[Any], request: GenerationRequest, full: str) -> str | None:
    """The text of the prompt up to the end of the prefix segments, or None when it is not a head of ``full``."""
    render = partial(backend.build_prompt, tools=request.chat_tools, variables=request.template_variables)
    text = render_prefix(render, row, request.turns, request.prefix_segments)
    return text if text is not None and full.startswith(text) else None


def _row_plan(backend: Any, row: list[Any], request: GenerationRequest, full: str, model: str, template: str) -> _Row:
    """One row's plan: its prompt's token ids and, where its prefix holds references and tokenizes as the head of
    the prompt, the prefix state's length and key."""
    tokenize = lambda text: backend.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids = list(tokenize(full))
    plan = _Row(ids=ids, packages=[s for s in row if isinstance(s, VisualPackage)])
    inside = _prefix_packages(row, request)
    text = _prefix_text(backend, row, request, full) if inside else None
    if text is None:
        return plan
    prefix_ids = _prefix_ids(backend, tokenize, ids, text, inside)
    # A prefix equal to the whole prompt leaves no token to start generation from.
    if prefix_ids is not None and len(prefix_ids) < len(ids):
        plan.prefix_len = len(prefix_ids)
        plan.prefix_packages = len(inside)
        plan.cache = request.prefix_cache
        plan.key = prefix_key(model, [p.key for p in inside], prefix_ids, template)
    return plan


def _prefix_packages(row: list[Any], request: GenerationRequest) -> list[VisualPackage]:
    """The cached packages in the row's prefix segments; none where the request keeps no prefix state or its prefix
    holds anything but text and packages (text alone is not worth keeping a state for)."""
    k = request.prefix_segments
    if request.prefix_cache is None or k <= 0 or any(not isinstance(s, (str, VisualPackage)) for s in row[:k]):
        return []
    return [s for s in row[:k] if isinstance(s, VisualPackage)]


def _prefix_ids(
    backend: Any, tokenize: Callable[[str], list[int]], ids: list[int], text: str, inside: list[VisualPackage],
) -> list[int] | None:
    """The prefix's token ids, a head of the prompt's ``ids`` holding all its packages' image tokens: the whole prefix
    text first; else cut back to the end of the last reference's placeholder. None when neither is."""
    image_ids = backend.image_token_ids
    image_tokens = sum(int(p.metadata["num_tokens"]) for p in inside)
    last = backend.image_placeholder(inside[-1])
    for candidate in (text, text[: text.rfind(last) + len(last)]):
        prefix_ids = list(tokenize(candidate))
        if ids[: len(prefix_ids)] == prefix_ids and sum(t in image_ids for t in prefix_ids) == image_tokens:
            return prefix_ids
    return None


def plan_prefixes(backend: Any, rows: list[list[Any]], requests: list[GenerationRequest], texts: list[str]) -> PrefixBatch | None:
    """The batch's prefix plan (``backend``: the calling HFBackend), or None when no row can reuse a
    prefix state (the plain path then runs)."""
    if not any(r.prefix_cache is not None and r.prefix_segments for r in requests):
        return None
    kinds = layer_kinds(backend)
    if kinds is None or backend.traits.no_prefix:
        return None
    model = f"{backend.fingerprint().digest}:{backend.device}"
    # The chat template's own hash too: a template given at load (--chat-template) never meets another's states.
    chat = hashlib.sha256((backend.chat_template_source() or "").encode()).hexdigest()[:16]
    template = f"{TEMPLATE}:{backend.family}{state_layout(backend)}:chat={chat}"
    plans = [_row_plan(backend, row, request, text, model, template) for row, request, text in zip(rows, requests, texts)]
    if not any(p.key for p in plans):
        return None
    return PrefixBatch(backend, plans, kinds)
