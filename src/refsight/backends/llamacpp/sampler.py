"""llama.cpp's own sampler chain for one request's :class:`~refsight.backends.sampling.Sampling`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .native import LlamaRuntime, NativeError

__all__ = ["Sampler"]


class Sampler:
    """llama.cpp's own sampler chain over the context's last logits.

    In order: the GBNF grammar (when there is one), the repetition penalty over the
    ``prompt_tokens`` and every sampled token (only when set), the OpenAI frequency/presence
    penalties over the last ``window`` sampled tokens (only when set), then greedy
    (temperature 0 or below the greedy threshold: the chain every default request has always
    had; llama.cpp divides float32 logits by the temperature, which overflows for tiny ones) or temperature,
    top-k, top-p, min-p and a seeded draw (a fresh seed when ``sampling.seed`` is None).
    """

    def __init__(
        self, runtime: LlamaRuntime, grammar: str | None, sampling: Any, window: int, prompt_tokens: Sequence[int] = ()
    ) -> None:
        L = runtime._L
        self._L, self._runtime = L, runtime
        self.chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        try:
            if grammar is not None:
                g = L.llama_sampler_init_grammar(runtime.vocab, grammar.encode(), b"root")
                if not g:
                    raise NativeError("llama.cpp rejected the JSON grammar")
                L.llama_sampler_chain_add(self.chain, g)
            if sampling.repetition_penalty != 1.0:
                self._add_repetition_penalty(float(sampling.repetition_penalty), prompt_tokens)
            if sampling.frequency_penalty or sampling.presence_penalty:
                L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_penalties(
                    runtime.n_vocab, max(int(window), 1), 1.0,
                    float(sampling.frequency_penalty), float(sampling.presence_penalty),
                ))
            self._add_pick(sampling)
        except BaseException:
            self.free()
            raise

    def _add_repetition_penalty(self, penalty: float, prompt_tokens: Sequence[int]) -> None:
        """llama.cpp's ``repeat_penalty`` over the whole context: the prompt's tokens, then each sampled one."""
        L, runtime = self._L, self._runtime
        repeat = L.llama_sampler_init_penalties(runtime.n_vocab, int(runtime.settings.n_ctx), penalty, 0.0, 0.0)
        L.llama_sampler_chain_add(self.chain, repeat)  # the chain owns it; accepting into it alone is fine
        for token in prompt_tokens:
            L.llama_sampler_accept(repeat, int(token))

    def _add_pick(self, sampling: Any) -> None:
        """Greedy, or temperature, top-p and a seeded draw."""
        L = self._L
        if sampling.greedy:
            L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_greedy())
            return
        L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_temp(float(sampling.temperature)))
        if sampling.top_k > 0:
            L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_top_k(int(sampling.top_k)))
        if sampling.top_p < 1.0:
            # min_keep 1, and a floor float32 cannot round to 0: the most likely token always stays.
            L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_top_p(sampling.runtime_top_p, 1))
        if sampling.min_p > 0:
            L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_min_p(float(sampling.min_p), 1))
        seed = sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(8), "little")
        # 0xFFFFFFFF is LLAMA_DEFAULT_SEED ("pick a random one"): a given seed never maps to it.
        L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_dist(int(seed) % 0xFFFFFFFF))

    def sample(self, output: int = -1) -> int:
        """Choose the next token from the last decode's output ``output`` (and advance the grammar and penalties)."""
        return int(self._L.llama_sampler_sample(self.chain, self._runtime.ctx, output))

    def free(self) -> None:
        """Release the chain (and the samplers it owns). Idempotent."""
        if self.chain:
            self._L.llama_sampler_free(self.chain)
            self.chain = None
