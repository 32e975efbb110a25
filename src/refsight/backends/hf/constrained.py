"""JSON-schema-constrained decoding for transformers ``generate`` with llguidance.

:func:`make_json_logits_processor` returns a ``LogitsProcessor`` that, at each step,
masks every token the schema's grammar cannot accept next. Once the grammar is
complete only the stop tokens stay allowed, so generation ends there (pass the same
ids as ``generate``'s ``eos_token_id``). Even a random-weight model therefore returns
schema-valid JSON, provided ``max_new_tokens`` covers the schema's longest output.

llguidance (a Rust wheel with no dependencies; llama.cpp and vLLM use it too) rather
than xgrammar, whose wheel pulls ``triton``, a gigabyte of GPU kernels a CPU install never
runs. The schema is first written the way the vLLM backend's xgrammar grammar reads it
(:mod:`refsight.backends.vllm.grammar`), so both runtimes constrain alike
(:func:`strict_schema`): compact separators ``", "`` and ``": "``, no free whitespace, an
object with ``properties`` closed unless it says otherwise, a number with a bound written
with at most six decimals, and a string with ``maxLength`` written without escapes,
control characters or surrogates, so the output parses under a strict JSON parser and
each character costs at most 4 bytes.

Building a tokenizer's llguidance view costs up to a second, so it is cached per
(tokenizer, vocab size, stop tokens), and compiled grammars per schema on top. The
processor itself holds per-sequence matcher state: build a new one for every
``generate`` call.

Greedy or sampled decoding only: beam search reorders rows, which this processor
does not follow.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import llguidance
import llguidance.hf
import llguidance.torch
import torch
import transformers

__all__ = [
    "make_json_logits_processor",
    "json_logits_processor",
    "compile_json_grammar",
    "strict_schema",
    "grammar_cache_info",
    "CompiledGrammar",
    "JsonSchemaLogitsProcessor",
]

_MAX_GRAMMARS = 256
_lock = threading.Lock()
# tokenizer -> {(vocab_size, stop ids): LLTokenizer}; weak so tokenizers can be freed.
_tokenizers: "weakref.WeakKeyDictionary[Any, dict[tuple, llguidance.LLTokenizer]]" = weakref.WeakKeyDictionary()
_grammars: "OrderedDict[tuple, CompiledGrammar]" = OrderedDict()
_stats = {"hits": 0, "misses": 0}

# Compact JSON, the separators json.dumps writes (the judge's token budget counts them).
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# A bounded string's characters: no quote, backslash or control character (so no escapes);
# the grammar runs on UTF-8 bytes decoded strictly, so no surrogate or overlong form either.
_STRICT_CHARS = '[^"\\\\\\x00-\\x1f]'
# A bounded number's precision: six decimals, as xgrammar writes a number with a bound.
_NUMBER_STEP = 0.000001
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_SUBSCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMAS = ("items", "additionalProperties", "not")


@dataclass(frozen=True)
class CompiledGrammar:
    """One schema's llguidance grammar for one tokenizer view; :meth:`matcher` starts a sequence."""

    tokenizer: llguidance.LLTokenizer
    grammar: str

    def matcher(self) -> llguidance.LLMatcher:
        """A fresh matcher at the start of the grammar."""
        return llguidance.LLMatcher(self.tokenizer, self.grammar)


def strict_schema(schema: Any) -> Any:
    """A copy of ``schema`` spelled the way refsight constrains it (see the module doc); data values
    (``enum``, ``const``, ``default`` ...) are left as they are."""
    if not isinstance(schema, dict):
        return schema
    out = _strict_subschemas(schema)
    if "properties" in out:
        out.setdefault("additionalProperties", False)
    if "prefixItems" in out:
        out.setdefault("items", False)
    if "maxLength" in out and not any(k in out for k in ("pattern", "format", "enum", "const")):
        low, high = out.pop("minLength", 0), out.pop("maxLength")
        out["pattern"] = f"^{_STRICT_CHARS}{{{low},{high}}}$"
    if _is_number(out) and any(k in out for k in _BOUNDS) and "multipleOf" not in out:
        out["multipleOf"] = _NUMBER_STEP
    return out


def _strict_subschemas(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` whose subschemas (alone, in lists, by name) are each :func:`strict_schema`'s."""
    out = dict(schema)
    for key in _SUBSCHEMAS:
        if key in out:
            out[key] = strict_schema(out[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [strict_schema(s) for s in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: strict_schema(s) for name, s in out[key].items()}
    return out


def _is_number(schema: dict) -> bool:
    kind = schema.get("type")
    return kind == "number" or (isinstance(kind, list) and "number" in kind)


def _stop_ids(tokenizer: Any, stop_token_ids: int | Sequence[int] | None) -> tuple[int, ...]:
    if stop_token_ids is None:
        stop_token_ids = getattr(tokenizer, "eos_token_id", None)
        if stop_token_ids is None:
            raise ValueError("the tokenizer has no eos_token_id; pass stop_token_ids (generate's eos ids)")
    if isinstance(stop_token_ids, int):
        stop_token_ids = [stop_token_ids]
    ids = tuple(sorted({int(i) for i in stop_token_ids}))
    if not ids:
        raise ValueError("stop_token_ids is empty: generation could never end")
    return ids


def _tokenizer_view(tokenizer: Any, vocab_size: int, stops: tuple[int, ...]) -> llguidance.LLTokenizer:
    per_tokenizer = _tokenizers.get(tokenizer)
    if per_tokenizer is None:
        per_tokenizer = _tokenizers[tokenizer] = {}
    view = per_tokenizer.get((vocab_size, stops))
    if view is None:
        view = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(stops))
        per_tokenizer[(vocab_size, stops)] = view
    return view


def compile_json_grammar(
    tokenizer: Any, schema: dict, vocab_size: int, *, stop_token_ids: int | Sequence[int] | None = None
) -> CompiledGrammar:
    """The compiled grammar of ``schema`` for this tokenizer (cached; compact, no free whitespace).

    ``vocab_size`` is the model's logits width (it may exceed ``len(tokenizer)``).
    Raises ValueError for a schema llguidance cannot compile.
    """
    if not isinstance(schema, dict):
        raise ValueError(f"schema must be a dict, not {type(schema).__name__}")
    vocab_size = int(vocab_size)
    if vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens")
    stops = _stop_ids(tokenizer, stop_token_ids)
    # Key order is kept: properties are written in the declared order.
    text = json.dumps(schema, ensure_ascii=False)
    with _lock:
        view = _tokenizer_view(tokenizer, vocab_size, stops)
        key = (id(view), text)
        grammar = _grammars.get(key)
        if grammar is not None:
            _grammars.move_to_end(key)
            _stats["hits"] += 1
            return grammar
        _stats["misses"] += 1
    grammar = CompiledGrammar(view, _llguidance_grammar(strict_schema(schema), view))
    with _lock:
        _grammars[key] = grammar
        while len(_grammars) > _MAX_GRAMMARS:
            _grammars.popitem(last=False)
    return grammar


def _llguidance_grammar(schema: dict, view: llguidance.LLTokenizer) -> str:
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
        error = llguidance.LLMatcher.validate_grammar(grammar, view)
    except Exception as e:  # llguidance raises ValueError/RuntimeError for schemas it does not take
        error = str(e)
    if error:
        raise ValueError(f"cannot compile JSON schema into a grammar: {error}")
    return grammar


def grammar_cache_info() -> dict[str, int]:
    """``{"hits", "misses", "size"}`` of the compiled-grammar cache (for tests and metrics)."""
    with _lock:
        return {**_stats, "size": len(_grammars)}


def json_logits_processor(
    tokenizer: Any, grammars: Sequence[CompiledGrammar | None], vocab_size: int, *,
    stop_token_ids: int | Sequence[int] | None = None,
) -> "JsonSchemaLogitsProcessor":
    """A fresh processor over grammars already compiled (:func:`compile_json_grammar`, same stop ids), one per row."""
    stops = _stop_ids(tokenizer, stop_token_ids)
    return JsonSchemaLogitsProcessor(list(grammars), vocab_size=int(vocab_size), stop_token_ids=stops)


def make_json_logits_processor(
    tokenizer: Any,
    schema: dict | Sequence[dict | None],
    vocab_size: int,
    *,
    stop_token_ids: int | Sequence[int] | None = None,
) -> "JsonSchemaLogitsProcessor":
    """A fresh processor constraining each row of one ``generate`` call to a JSON schema.

    ``schema`` is one schema for every row, or one per row (``None`` leaves that row
    free). ``stop_token_ids`` defaults to the tokenizer's eos; it must be what
    ``generate`` stops on. Use the processor for a single ``generate`` call.
    """
    stops = _stop_ids(tokenizer, stop_token_ids)
    if isinstance(schema, dict):
        grammars: list[CompiledGrammar | None] | CompiledGrammar = compile_json_grammar(
            tokenizer, schema, vocab_size, stop_token_ids=stops
        )
    else:
        grammars = [
            None if s is None else compile_json_grammar(tokenizer, s, vocab_size, stop_token_ids=stops)
            for s in schema
        ]
    return JsonSchemaLogitsProcessor(grammars, vocab_size=int(vocab_size), stop_token_ids=stops)


class JsonSchemaLogitsProcessor(transformers.LogitsProcessor):
    """Masks logits to what each row's grammar accepts; forces a stop token once it is complete.

    A row whose sampled token the grammar rejects (only possible when something else
    edits the logits after this processor) is sent to a stop token rather than raising:
    its text then fails validation downstream, which the judge handles.
    """

    def __init__(
        self,
        grammars: "CompiledGrammar | Sequence[CompiledGrammar | None]",
        *,
        vocab_size: int,
        stop_token_ids: Sequence[int],
    ) -> None:
        self._grammars = grammars
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)
        self._matchers: list[llguidance.LLMatcher | None] | None = None
        self._done: list[bool] = []
        self._bitmask: torch.Tensor | None = None
        self._stop_row: torch.Tensor | None = None
        #: Rows whose sampled token the grammar rejected (see the class docstring).
        self.rejected_rows: set[int] = set()

    def _start(self, batch: int) -> None:
        grammars = self._grammars
        if not isinstance(grammars, (list, tuple)):
            grammars = [grammars] * batch
        if len(grammars) != batch:
            raise ValueError(f"{len(grammars)} schemas for a batch of {batch} rows")
        self._matchers = [None if g is None else g.matcher() for g in grammars]
        self._done = [False] * batch
        self._bitmask = llguidance.torch.allocate_token_bitmask(batch, self.vocab_size)
        words = [0] * self._bitmask.shape[1]
        for t in self.stop_token_ids:
            if t < self.vocab_size:
                words[t // 32] |= 1 << (t % 32)
        # The bitmask is int32: bit 31 set means a negative number.
        self._stop_row = torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)

    def _accept(self, input_ids: torch.Tensor) -> None:
        """Feed each live row its last sampled token; a stop token or a finished grammar ends the row."""
        assert self._matchers is not None
        for i, matcher in enumerate(self._matchers):
            if matcher is None or self._done[i]:
                continue
            token = int(input_ids[i, -1])
            if token in self.stop_token_ids:
                self._done[i] = True  # generate ends the row here; later ids are padding
            elif not matcher.consume_token(token) or matcher.is_error():
                self.rejected_rows.add(i)
                self._done[i] = True
            elif matcher.is_stopped():
                self._done[i] = True

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Accept the last sampled token per row, then mask ``scores`` to the allowed next tokens."""
        batch = input_ids.shape[0]
        if self._matchers is None:
            self._start(batch)  # first call: the prompt, nothing sampled yet
        elif batch != len(self._matchers):
            raise ValueError(f"batch changed from {len(self._matchers)} to {batch} rows; use one processor per call")
        else:
            self._accept(input_ids)
        assert self._matchers is not None and self._bitmask is not None and self._stop_row is not None
        for i, matcher in enumerate(self._matchers):
            if matcher is None:
                self._bitmask[i] = -1  # all bits set: this row is free
            elif self._done[i]:
                self._bitmask[i] = self._stop_row
            else:
                llguidance.torch.fill_next_token_bitmask(matcher, self._bitmask, i)
                if matcher.is_accepting():  # every stop id may end a complete answer, not only the first
                    self._bitmask[i] |= self._stop_row
        return _apply(scores, self._bitmask, self.vocab_size)


def _apply(scores: torch.Tensor, bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    # Plain torch rather than a kernel: works for any device and dtype, and the cost (one
    # shift per vocabulary entry) is small next to a forward pass.
    width = scores.shape[-1]
    shifts = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().reshape(bitmask.shape[0], -1)
    allowed = allowed[:, : min(width, vocab_size)]
    if width > allowed.shape[1]:  # logits wider than the grammar's vocabulary: padding ids
        pad = torch.zeros(allowed.shape[0], width - allowed.shape[1], dtype=torch.bool)
        allowed = torch.cat([allowed, pad], dim=1)
    return scores.masked_fill(~allowed.to(scores.device), float("-inf"))
