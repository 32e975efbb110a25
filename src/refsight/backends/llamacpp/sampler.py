"""llama.cpp's own sampler chain for one request's :class:`~refsight.sampling.Sampling`."""

from __future__ import annotations

import ctypes
import math
import os
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import InvalidInputError
from ...sampling import WHOLE_CONTEXT
from .grammar_stacks import CheckedGrammar, GrammarStacks
from .native import LlamaRuntime, NativeError

__all__ = ["Sampler", "eog_tokens"]

#: ``llama_token_data`` as numpy lays it out: the array the chain works on, filled from one row of logits.
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])

#: Each runtime's end-of-generation tokens, found once (a walk over the vocabulary).
_EOG: weakref.WeakKeyDictionary[LlamaRuntime, tuple[int, ...]] = weakref.WeakKeyDictionary()


def eog_tokens(runtime: LlamaRuntime) -> tuple[int, ...]:
    """The vocabulary's end-of-generation tokens (EOS, EOT, ``<|im_end|>`` ...), as llama-server collects them."""
    found = _EOG.get(runtime)
    if found is None:
        found = _EOG[runtime] = tuple(t for t in range(runtime.n_vocab) if runtime.is_eog(t))
    return found


class Sampler:
    """llama.cpp's own sampler chain over the context's last logits.

    In order: the logit bias (``sampling.logit_bias``, and ``-inf`` on every end-of-generation
    token with ``sampling.ignore_eos``, as llama-server fills it), the GBNF grammar (when there
    is one: a JSON schema's, or ``sampling.grammar``), the repetition penalty over the last
    ``sampling.repeat_last_n`` of the ``prompt_tokens`` and every sampled token (only when set), the OpenAI frequency/presence
    penalties over the last ``window`` sampled tokens (only when set), then greedy
    (temperature 0 or below the greedy threshold: the chain every default request has always
    had; llama.cpp divides float32 logits by the temperature, which overflows for tiny ones) or top-k, top-p,
    min-p, temperature and a seeded draw (a fresh seed when ``sampling.seed`` is None), llama-server's order.

    With a grammar, its stacks are followed beside llama.cpp's (:class:`~.grammar_stacks.GrammarStacks`),
    and a token is accepted only where llama.cpp can go on: never one the chain left at ``-inf``
    (llama.cpp's grammar aborts the process on an end-of-generation token while the grammar is open, and
    on any other token it does not allow), never one that would leave it no stack or too many. When the
    bias and the grammar together leave no token, the answer ends there if the grammar is complete (its
    end, with the end-of-generation tokens banned: :meth:`sample` returns None); otherwise, and for a
    token llama.cpp could not follow, the request is refused naming ``grammar``.
    """

    def __init__(
        self, runtime: LlamaRuntime, grammar: CheckedGrammar | None, sampling: Any, window: int,
        prompt_tokens: Sequence[int] = (),
    ) -> None:
        L = runtime._L
        self._L, self._runtime = L, runtime
        self.greedy = sampling.greedy
        self.stacks = GrammarStacks(grammar) if grammar is not None else None
        self.chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        try:
            self._add_logit_bias(sampling)
            if grammar is not None:
                g = L.llama_sampler_init_grammar(runtime.vocab, grammar.text.encode(), b"root")
                if not g:
                    raise NativeError("llama.cpp rejected the grammar")
                L.llama_sampler_chain_add(self.chain, g)
            if sampling.repetition_penalty != 1.0:
                self._add_repetition_penalty(float(sampling.repetition_penalty), sampling.repeat_last_n, prompt_tokens)
            if sampling.frequency_penalty or sampling.presence_penalty:
                L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_penalties(
                    runtime.n_vocab, max(int(window), 1), 1.0,
                    float(sampling.frequency_penalty), float(sampling.presence_penalty),
                ))
            self._add_pick(sampling)
        except BaseException:
            self.free()
            raise

    def _add_logit_bias(self, sampling: Any) -> None:
        """llama.cpp's logit-bias sampler over the request's pairs (and the banned EOG tokens with ``ignore_eos``)."""
        pairs = list(sampling.logit_bias)
        if sampling.ignore_eos:
            pairs += [(token, -math.inf) for token in eog_tokens(self._runtime)]
        if not pairs:
            return
        L = self._L
        array = (L.llama_logit_bias * len(pairs))(*[L.llama_logit_bias(token, bias) for token, bias in pairs])
        bias = L.llama_sampler_init_logit_bias(self._runtime.n_vocab, len(pairs), ctypes.cast(array, L.llama_logit_bias_p))
        if not bias:
            raise NativeError("llama.cpp refused the logit bias")
        L.llama_sampler_chain_add(self.chain, bias)  # it copies the pairs: the array may go

    def _add_repetition_penalty(self, penalty: float, window: int, prompt_tokens: Sequence[int]) -> None:
        """llama.cpp's ``repeat_penalty`` over the last ``window`` tokens (llama-server's ``repeat_last_n``; -1: the
        whole context) of the prompt's text and the answer: the prompt's tokens, then each sampled one."""
        L, runtime = self._L, self._runtime
        window = int(runtime.settings.n_ctx) if window == WHOLE_CONTEXT else int(window)
        repeat = L.llama_sampler_init_penalties(runtime.n_vocab, window, penalty, 0.0, 0.0)
        L.llama_sampler_chain_add(self.chain, repeat)  # the chain owns it; accepting into it alone is fine
        for token in prompt_tokens[len(prompt_tokens) - window:] if window else ():  # it keeps the last window alone
            L.llama_sampler_accept(repeat, int(token))

    def _add_pick(self, sampling: Any) -> None:
        """Greedy, or top-k, top-p, min-p, temperature and a seeded draw: llama-server's order (and
        llama-cpp-python's), so a seeded request draws the tokens they draw."""
        L = self._L
        if sampling.greedy:
            L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_greedy())
            return
        if sampling.top_k > 0:
            L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_top_k(int(sampling.top_k)))
        if sampling.top_p < 1.0:
            # min_keep 1, and a floor float32 cannot round to 0: the most likely token always stays.
            L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_top_p(sampling.runtime_top_p, 1))
        if sampling.min_p > 0:
            L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_min_p(float(sampling.min_p), 1))
        L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_temp(float(sampling.temperature)))
        seed = sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(8), "little")
        # 0xFFFFFFFF is LLAMA_DEFAULT_SEED ("pick a random one"): a given seed never maps to it.
        L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_dist(int(seed) % 0xFFFFFFFF))

    def sample(self, output: int = -1) -> int | None:
        """Choose the next token from the last decode's output ``output`` (and advance the grammar and penalties);
        None when the grammar is complete and nothing else may follow (see the class)."""
        if self.stacks is None:
            return int(self._L.llama_sampler_sample(self.chain, self._runtime.ctx, output))
        return self._pick(self._runtime.last_logits(output))[0]

    def sample_with_probs(self, logits: np.ndarray) -> tuple[int | None, np.ndarray, np.ndarray]:
        """Choose the next token from ``logits`` (the output's row) as :meth:`sample` does, and return what the
        chain left with it: ``(token, ids, probabilities)`` of the tokens it kept (llama-server's post-sampling
        probabilities). ``llama_sampler_sample``'s own steps over an array held here: the same token."""
        token, kept, selected = self._pick(logits)
        size = kept.size
        probs = kept["p"].astype(np.float64)
        if self.greedy:  # argmax computes no probabilities: the chain keeps that one token, as llama-server's temp 0
            probs = np.zeros(size)
            probs[selected] = 1.0
        return token, kept["id"].copy(), probs

    def _pick(self, logits: np.ndarray) -> tuple[int | None, np.ndarray, int]:
        """``llama_sampler_sample``'s steps over ``logits``: the chain applied, its token accepted (None: the
        grammar's end, nothing accepted); with the tokens the chain kept and the chosen one's index."""
        L = self._L
        data = np.zeros(logits.size, dtype=_TOKEN_DATA)
        data["id"] = np.arange(logits.size, dtype=np.int32)
        data["logit"] = logits
        array = L.llama_token_data_array(data.ctypes.data_as(L.llama_token_data_p), logits.size, -1, False)
        L.llama_sampler_apply(self.chain, ctypes.byref(array))
        size, selected = int(array.size), int(array.selected)
        if not 0 <= selected < size:
            raise NativeError("the sampler chain selected no token")
        # A sampler may point the array at its own buffer: read where it points, not the array given.
        raw = ctypes.cast(array.data, ctypes.POINTER(ctypes.c_uint8 * (size * _TOKEN_DATA.itemsize))).contents
        kept = np.frombuffer(bytes(raw), dtype=_TOKEN_DATA)
        token = int(kept["id"][selected])
        if self.stacks is not None:
            if kept["logit"][selected] == -math.inf:  # the bias and the grammar left nothing: any token would abort
                if self.stacks.complete:
                    return None, kept, selected
                raise InvalidInputError("grammar", "no token of the vocabulary can continue the answer here (the "
                                                   "grammar allows none, or only tokens logit_bias or ignore_eos bans)")
            runtime = self._runtime
            self.stacks.accept(token, runtime.piece(token, True), runtime.is_eog(token))
        L.llama_sampler_accept(self.chain, token)
        return token, kept, selected

    def free(self) -> None:
        """Release the chain (and the samplers it owns). Idempotent."""
        if self.chain:
            self._L.llama_sampler_free(self.chain)
            self.chain = None
