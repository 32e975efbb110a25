"""JSON-schema-constrained decoding for transformers ``generate`` with xgrammar.

:func:`make_json_logits_processor` returns a ``LogitsProcessor`` that, at each step,
masks every token the schema's grammar cannot accept next. Once the grammar is
complete only the stop tokens stay allowed, so generation ends there (pass the same
ids as ``generate``'s ``eos_token_id``). Even a random-weight model therefore returns
schema-valid JSON, provided ``max_new_tokens`` covers the schema's longest output.

Strings with ``maxLength`` are written without escapes and, unlike xgrammar's
default, without raw control characters (JSON forbids them) or surrogates, so the
output parses under a strict JSON parser and each character costs at most 4 bytes.

Compiling a grammar costs milliseconds to seconds (it scales with the vocabulary), so
compiled grammars are cached per (tokenizer, vocab size, stop tokens, schema). The
processor itself holds per-sequence matcher state: build a new one for every
``generate`` call.

Greedy or sampled decoding only: beam search reorders rows, which this processor
does not follow.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from collections import OrderedDict
from typing import Any, Sequence

import torch
import transformers
import xgrammar as xgr

__all__ = [
    "make_json_logits_processor",
    "json_logits_processor",
    "compile_json_grammar",
    "json_schema_ebnf",
    "grammar_cache_info",
    "JsonSchemaLogitsProcessor",
]

_MAX_GRAMMARS = 256
_lock = threading.Lock()
# tokenizer -> {(vocab_size, stop ids): GrammarCompiler}; weak so tokenizers can be freed.
_compilers: "weakref.WeakKeyDictionary[Any, dict[tuple, xgr.GrammarCompiler]]" = weakref.WeakKeyDictionary()
_grammars: "OrderedDict[tuple, xgr.CompiledGrammar]" = OrderedDict()
_stats = {"hits": 0, "misses": 0}


# xgrammar writes a string with maxLength as a run of this character class: no escapes,
# but raw control characters allowed (invalid JSON) ...
_BOUNDED_CHAR = r'[^\"\\\r\n]'
# ... so it is replaced with one that also refuses control characters and surrogates.
# The EBNF class decodes UTF-8 strictly (no overlong forms), unlike xgrammar's regex
# path for ``pattern``, which lets overlong 3-byte sequences through.
_STRICT_CHAR = r'[^\0-\x1f\"\\\uD800-\uDFFF]'


def _json_grammar(schema_text: str) -> "xgr.Grammar":
    """The schema's grammar, with bounded strings made strict JSON (see _STRICT_CHAR)."""
    # any_whitespace=False: free whitespace would let a weak model pad forever and would
    # make the output length unbounded.
    grammar = xgr.Grammar.from_json_schema(schema_text, any_whitespace=False, strict_mode=True)
    text = str(grammar)
    if _BOUNDED_CHAR in text:
        grammar = xgr.Grammar.from_ebnf(text.replace(_BOUNDED_CHAR, _STRICT_CHAR))
    return grammar


def json_schema_ebnf(schema: dict) -> str:
    """The EBNF text of ``schema``'s grammar exactly as this module constrains it.

    For runtimes that take a grammar rather than a schema (vLLM's ``structured_outputs``),
    so they constrain the same way: compact, strict JSON strings.
    """
    return str(_json_grammar(json.dumps(schema, ensure_ascii=False)))


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


def _compiler(tokenizer: Any, vocab_size: int, stops: tuple[int, ...]) -> xgr.GrammarCompiler:
    per_tokenizer = _compilers.get(tokenizer)
    if per_tokenizer is None:
        per_tokenizer = _compilers[tokenizer] = {}
    compiler = per_tokenizer.get((vocab_size, stops))
    if compiler is None:
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=list(stops))
        # The host is shared: a handful of compile threads is plenty for JSON schemas.
        compiler = xgr.GrammarCompiler(info, max_threads=max(1, min(4, os.cpu_count() or 1)))
        per_tokenizer[(vocab_size, stops)] = compiler
    return compiler


def compile_json_grammar(
    tokenizer: Any, schema: dict, vocab_size: int, *, stop_token_ids: int | Sequence[int] | None = None
) -> xgr.CompiledGrammar:
    """The compiled grammar of ``schema`` for this tokenizer (cached; compact, no free whitespace).

    ``vocab_size`` is the model's logits width (it may exceed ``len(tokenizer)``).
    Raises ValueError for a schema xgrammar cannot compile.
    """
    if not isinstance(schema, dict):
        raise ValueError(f"schema must be a dict, not {type(schema).__name__}")
    vocab_size = int(vocab_size)
    if vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens")
    stops = _stop_ids(tokenizer, stop_token_ids)
    # Key order is kept: xgrammar emits properties in the declared order.
    text = json.dumps(schema, ensure_ascii=False)
    with _lock:
        compiler = _compiler(tokenizer, vocab_size, stops)
        key = (id(compiler), text)
        grammar = _grammars.get(key)
        if grammar is not None:
            _grammars.move_to_end(key)
            _stats["hits"] += 1
            return grammar
        _stats["misses"] += 1
    try:
        grammar = compiler.compile_grammar(_json_grammar(text))
    except Exception as e:  # xgrammar raises RuntimeError/ValueError subclasses for bad schemas
        raise ValueError(f"cannot compile JSON schema into a grammar: {e}") from e
    with _lock:
        _grammars[key] = grammar
        while len(_grammars) > _MAX_GRAMMARS:
            _grammars.popitem(last=False)
    return grammar


def grammar_cache_info() -> dict[str, int]:
    """``{"hits", "misses", "size"}`` of the compiled-grammar cache (for tests and metrics)."""
    with _lock:
        return {**_stats, "size": len(_grammars)}


def json_logits_processor(
    tokenizer: Any, grammars: Sequence[xgr.CompiledGrammar | None], vocab_size: int, *,
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
        grammars: list[xgr.CompiledGrammar | None] | xgr.CompiledGrammar = compile_json_grammar(
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
        grammars: "xgr.CompiledGrammar | Sequence[xgr.CompiledGrammar | None]",
        *,
        vocab_size: int,
        stop_token_ids: Sequence[int],
    ) -> None:
        self._grammars = grammars
        self.vocab_size = vocab_size
        self.stop_token_ids = tuple(stop_token_ids)
        self._matchers: list[xgr.GrammarMatcher | None] | None = None
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
        self._matchers = [None if g is None else xgr.GrammarMatcher(g) for g in grammars]
        self._done = [False] * batch
        self._bitmask = xgr.allocate_token_bitmask(batch, self.vocab_size)
        words = [0] * self._bitmask.shape[1]
        for t in self.stop_token_ids:
            if t < self.vocab_size:
                words[t // 32] |= 1 << (t % 32)
        # The bitmask is int32: bit 31 set means a negative number.
        self._stop_row = torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Accept the last sampled token per row, then mask ``scores`` to the allowed next tokens."""
        batch = input_ids.shape[0]
        if self._matchers is None:
            self._start(batch)  # first call: the prompt, nothing sampled yet
        else:
            if batch != len(self._matchers):
                raise ValueError(f"batch changed from {len(self._matchers)} to {batch} rows; use one processor per call")
            for i, matcher in enumerate(self._matchers):
                if matcher is None or self._done[i]:
                    continue
                if not matcher.accept_token(int(input_ids[i, -1])):
                    self.rejected_rows.add(i)
                    self._done[i] = True
                elif matcher.is_terminated():
                    self._done[i] = True
        assert self._bitmask is not None and self._stop_row is not None
        for i, matcher in enumerate(self._matchers):
            if matcher is None:
                self._bitmask[i] = -1  # all bits set: this row is free
            elif self._done[i]:
                self._bitmask[i] = self._stop_row
            else:
                matcher.fill_next_token_bitmask(self._bitmask, i)
        return _apply(scores, self._bitmask, self.vocab_size)


def _apply(scores: torch.Tensor, bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    # Plain torch rather than xgrammar's kernels: works for any device and dtype, and the
    # cost (one shift per vocabulary entry) is small next to a forward pass.
    width = scores.shape[-1]
    shifts = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().reshape(bitmask.shape[0], -1)
    allowed = allowed[:, : min(width, vocab_size)]
    if width > allowed.shape[1]:  # logits wider than the grammar's vocabulary: padding ids
        pad = torch.zeros(allowed.shape[0], width - allowed.shape[1], dtype=torch.bool)
        allowed = torch.cat([allowed, pad], dim=1)
    return scores.masked_fill(~allowed.to(scores.device), float("-inf"))
