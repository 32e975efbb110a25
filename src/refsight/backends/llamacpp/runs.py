"""One llama.cpp request on one sequence: its prompt evaluated, its answer decoded, its result.

:func:`start_run` evaluates a prepared request's prompt into a sequence (the reference
prefix state restored when one is stored) and returns a :class:`Run`, whose
:class:`~.generation.TokenLoop` then decodes the answer: alone
(:meth:`Run.decode_alone`, one request at a time) or in decode steps shared with other
sequences (:mod:`.slots`). :class:`GenerateJob` and :class:`ScoreJob` are the two kinds
of work the slots take.

The caller holds the backend's lock around every call that touches the runtime.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..base import Execution, Generation, PreparedRequest
from .generation import TokenLoop, decode_prompt

__all__ = ["GenerateJob", "Run", "ScoreJob", "score_prompt", "start_run"]


def _torch(logits: Any) -> Any:
    if logits is None:
        return None
    import torch

    return torch.from_numpy(logits)


@dataclass
class Run:
    """A request whose prompt is in its sequence: the token loop, and what the prompt cost."""

    backend: Any
    seq: int
    loop: TokenLoop
    plan: Any
    counts: list[int]
    encode_ms: float
    return_logits: bool
    began: float = field(default_factory=time.perf_counter)

    def decode_alone(self) -> None:
        """Decode the whole answer on this sequence alone, one token per ``llama_decode``."""
        runtime, loop = self.backend.runtime, self.loop
        try:
            while loop.max_new_tokens and not loop.step():
                runtime.decode_token(loop.token, loop.n_past, self.seq)
                loop.advance()
        finally:
            loop.close()

    def generation(self) -> Generation:
        """The finished request as a :class:`Generation` (the loop's held-back text sent)."""
        tokens, answer, finish, logits = self.loop.result()
        total_ms = (time.perf_counter() - self.began) * 1000
        plan = self.plan
        return Generation(
            text=answer,
            token_ids=tokens,
            model=self.backend.name,
            random_weights=self.backend.random_weights,
            logits=_torch(logits) if self.return_logits else None,
            timings_ms={
                "encode": self.encode_ms,
                "generate": total_ms - self.encode_ms,
                "total": total_ms,
                # Building or loading the reference prefix's state (as the HF backend reports them).
                **({"prefix_build": plan.build_ms, "prefix_load": plan.restore_ms} if plan is not None else {}),
            },
            prompt_tokens=self.counts[0],
            image_tokens=self.counts[1:],
            finish_reason=finish,
            prefix_tokens_reused=plan.prefix_tokens if plan is not None and plan.outcome == "hit" else 0,
            logprobs=self.loop.logprobs if self.loop.n_probs is not None else None,
        )


def start_run(backend: Any, prepared: PreparedRequest, execution: Execution, seq: int) -> Run:
    """Evaluate ``prepared``'s prompt into sequence ``seq`` (``execution.on_prompt`` told as it starts and ends);
    the :class:`Run` that decodes its answer."""
    request = prepared.request
    began = time.perf_counter()
    text, plan = prepared.prompt, prepared.prefix  # rendered and planned by the backend's prepare, before the lock
    n_past, prompt_timings, counts = decode_prompt(
        backend.runtime, text, prepared.segments, plan, seq, on_prompt=execution.on_prompt
    )
    loop = TokenLoop(
        backend.runtime, n_past, request.max_new_tokens, grammar=prepared.grammar, sampling=request.sampling,
        return_logits=execution.return_logits, on_text=execution.on_text, stop_event=execution.stop_event,
        prompt_tokens=backend.prompt_token_ids(text) if request.sampling.repetition_penalty != 1.0 else (),
        prompt_cells=counts[0],
    )
    return Run(backend, seq, loop, plan, counts, prompt_timings["encode"], execution.return_logits, began)


def score_prompt(backend: Any, prepared: PreparedRequest, seq: int, answer_ids: tuple[int, int]) -> float:
    """P("yes"): the softmax over the "yes"/"no" logits after ``prepared``'s prompt, evaluated into ``seq``."""
    decode_prompt(backend.runtime, prepared.prompt, prepared.segments, prepared.prefix, seq)
    pair = backend.runtime.last_logits()[list(answer_ids)].astype(np.float64)
    pair = np.exp(pair - pair.max())
    return float(pair[0] / pair.sum())


class GenerateJob:
    """A generation for the slots: its prompt evaluated on admission, its tokens in shared decode steps."""

    def __init__(self, backend: Any, prepared: PreparedRequest, execution: Execution) -> None:
        self.backend, self.prepared, self.execution = backend, prepared, execution
        self.run: Run | None = None

    def begin(self, seq: int) -> TokenLoop:
        """Evaluate the prompt into ``seq``; the loop the shared steps drive."""
        self.run = start_run(self.backend, self.prepared, self.execution, seq)
        return self.run.loop

    def end(self) -> Generation:
        """The finished request's :class:`Generation`."""
        assert self.run is not None
        return self.run.generation()


class ScoreJob:
    """A yes/no score for the slots: all of it happens on admission (one prompt, no decoding)."""

    def __init__(self, backend: Any, prepared: PreparedRequest, answer_ids: tuple[int, int]) -> None:
        self.backend, self.prepared, self.answer_ids = backend, prepared, answer_ids
        self.value = 0.0

    def begin(self, seq: int) -> None:
        """Evaluate the prompt into ``seq`` and keep the score; nothing is left to decode."""
        self.value = score_prompt(self.backend, self.prepared, seq, self.answer_ids)

    def end(self) -> float:
        """P("yes")."""
        return self.value
