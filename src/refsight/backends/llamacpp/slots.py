"""Parallel slots: up to N requests decoding together on one llama context (llama-server's ``-np N``).

A llama context loaded with ``n_seq = N`` holds N sequences, each with a KV stream of
its own. :class:`Slots` runs one scheduler thread over them:

1. **admit**: a waiting job takes a free sequence; its prompt is evaluated into that
   sequence at once (the reference prefix state restored into it when one is stored), and
   its first token is sampled before the next prompt overwrites the logits;
2. **step**: every admitted job's next token is decoded, each at its own position in its
   own sequence, in ``llama_decode`` calls of at most ``runtime.invariant_step_rows``
   sequences (:data:`~.native.INVARIANT_STEP_ROWS` for quantized weights, one for float
   weights), and each job samples its next token from its own output row. A job leaves
   its slot when it finishes (end of text, stop string, length, its stop event set) or
   fails; a waiting job takes the slot before the next step.

**An answer does not depend on what decodes beside it**: every request gets the tokens
and logits, bit for bit, that it gets alone. Prompts are evaluated one at a time, exactly
as alone; a decode call carries no more sequences than ggml's CPU kernels allow before they
switch to another summation order (three for quantized weights: a fourth row takes
repacked weights to a GEMM; one for float weights); and the backend turns llama.cpp's
flash attention off for slots by default (its CPU kernel sums a lone sequence's keys in
per-thread parts once they pass 512, a call of several sequences in one pass). On a CPU the
short calls cost little: a decode step there is bound by arithmetic more than by reading
the weights, so a call of 8 saves little over calls of 3 (``benchmarks/parallel_slots.py``
measures both on the machine it runs on).

Every call into llama.cpp holds the backend's lock, so encodes and tokenizing interleave
safely between steps.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from ...errors import GenerationError, RefsightError
from .generation import TokenLoop

__all__ = ["SlotJob", "Slots"]


class SlotJob(Protocol):
    """Work for a slot: :meth:`begin` on admission (under the lock), :meth:`end` once finished."""

    def begin(self, seq: int) -> TokenLoop | None:
        """Evaluate the prompt into ``seq``; the loop to drive, or None when nothing is left to decode."""

    def end(self) -> Any:
        """The job's result."""


class _Waiting:
    """A submitted job and what became of it."""

    def __init__(self, job: SlotJob) -> None:
        self.job = job
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def settle(self, loop: TokenLoop | None = None) -> None:
        """Finish the job: its result, or the error its ending raised."""
        try:
            if loop is not None:
                loop.close()
            self.value = self.job.end()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
            self.error = e
        self.done.set()

    def fail(self, error: BaseException, loop: TokenLoop | None = None) -> None:
        """Finish the job with ``error``."""
        if loop is not None:
            loop.close()
        self.error = error
        self.done.set()


class Slots:
    """The scheduler over ``n`` sequences of ``runtime``; :meth:`run` blocks until its jobs are done."""

    def __init__(self, name: str, runtime: Any, lock: threading.RLock, n: int) -> None:
        self.name, self.runtime, self.lock, self.n = name, runtime, lock, n
        self._queue: queue.Queue[_Waiting | None] = queue.Queue()
        self._active: dict[int, tuple[_Waiting, TokenLoop]] = {}
        #: ``llama_decode`` calls of the decode steps so far, and the sequences they carried (``batched / steps``)
        self.steps = self.batched = 0
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"refsight-slots-{name}", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> int:
        """Sequences decoding now."""
        return len(self._active)

    def run(self, jobs: Sequence[SlotJob]) -> list[Any]:
        """Submit ``jobs`` (they may share decode steps with each other and with other callers); their results."""
        if self._closed:
            raise GenerationError(self.name, "the model was closed")
        waiting = [_Waiting(job) for job in jobs]
        for w in waiting:
            self._queue.put(w)
        for w in waiting:
            w.done.wait()
        for w in waiting:
            if w.error is not None:
                raise w.error
        return [w.value for w in waiting]

    def close(self) -> None:
        """Stop the scheduler once the jobs already submitted are done."""
        self._closed = True
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    # ------------------------------------------------------------------ the thread

    def _serve(self) -> None:
        closing = False
        try:
            while not closing or self._active:
                closing = self._admit(closing)
                if self._active:
                    self._step()
        except BaseException as e:  # noqa: BLE001 - a bug here must not leave callers waiting forever
            self._closed = True
            error = GenerationError(self.name, f"the slot scheduler stopped: {type(e).__name__}: {e}")
            for waiting, loop in self._active.values():
                waiting.fail(error, loop)
            while not self._queue.empty():
                waiting = self._queue.get_nowait()
                if waiting is not None:
                    waiting.fail(error)

    def _admit(self, closing: bool) -> bool:
        """Fill free sequences from the queue (block while nothing is active); True once told to close."""
        while not closing and len(self._active) < self.n:
            try:
                waiting = self._queue.get(block=not self._active)
            except queue.Empty:
                break
            if waiting is None:
                return True
            self._start(waiting, next(s for s in range(self.n) if s not in self._active))
        return closing

    def _start(self, waiting: _Waiting, seq: int) -> None:
        loop = None
        try:
            with self.lock:
                loop = waiting.job.begin(seq)
                finished = loop is None or not loop.max_new_tokens or loop.step()
        except BaseException as e:  # noqa: BLE001 - the job's caller gets it, the slot goes on
            waiting.fail(self._translated(e), loop)
            return
        if finished:
            waiting.settle(loop)
        else:
            self._active[seq] = (waiting, loop)

    def _step(self) -> None:
        """The next token of every active sequence, in decode calls the runtime's kernels keep exact."""
        seqs = list(self._active)
        rows = self.runtime.invariant_step_rows
        for first in range(0, len(seqs), rows):
            self._decode_together(seqs[first:first + rows])

    def _decode_together(self, seqs: list[int]) -> None:
        """One ``llama_decode`` for ``seqs``, then each samples from its own output."""
        loops = [self._active[seq][1] for seq in seqs]
        with self.lock:
            try:
                self.runtime.decode_batch([(loop.token, loop.n_past, seq) for loop, seq in zip(loops, seqs)])
            except BaseException as e:  # noqa: BLE001 - every job in the step failed with it
                for seq in seqs:
                    waiting, loop = self._active.pop(seq)
                    waiting.fail(self._translated(e), loop)
                return
            self.steps += 1
            self.batched += len(seqs)
            for output, seq in enumerate(seqs):
                waiting, loop = self._active[seq]
                loop.advance()
                try:
                    finished = loop.step(output)
                except BaseException as e:  # noqa: BLE001
                    del self._active[seq]
                    waiting.fail(self._translated(e), loop)
                    continue
                if finished:
                    del self._active[seq]
                    waiting.settle(loop)

    def _translated(self, error: BaseException) -> BaseException:
        if isinstance(error, RefsightError) or not isinstance(error, Exception):
            return error
        translated = GenerationError(self.name, f"generation failed: {type(error).__name__}: {error}")
        translated.__cause__ = error
        return translated
