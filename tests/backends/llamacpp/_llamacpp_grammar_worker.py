"""Run in a NEW process by test_gbnf_differential.py: llama.cpp's own grammar parser and sampler.

``python _llamacpp_grammar_worker.py MODEL.gguf`` loads the GGUF's vocabulary only, then reads one
JSON line per grammar on stdin (``{"grammar": ..., "bounded": true, "seed": 1}``) and answers one
JSON line each: ``vocabulary`` (the reason refsight's check of its token references against the
vocabulary refused it, else None), ``parsed`` (llama.cpp's parser took it), and, for a parsed grammar,
the end of a short run of its sampler over every token of the vocabulary with random logits, refsight's
way (a token left at -inf never accepted, each token followed first by refsight's
:class:`~refsight.backends.llamacpp.grammar_stacks.GrammarStacks`): ``complete`` (nothing may follow),
``stuck`` (no token can go on), ``steps`` (it ran them all) or ``refused: ...`` (refsight's stacks
refused a token: the request would end with that 400). A crash ends the process: the test sees which
grammar did it.
"""

from __future__ import annotations

import ctypes
import json
import random
import sys

import llama_cpp as L

from refsight.backends.llamacpp.grammar import check_grammar
from refsight.backends.llamacpp.grammar_stacks import CheckedGrammar, GrammarStacks
from refsight.errors import InvalidInputError

STEPS = 12


@L.llama_log_callback
def _quiet(level, text, user_data):  # noqa: ARG001 - llama.cpp's refusals are expected here
    return None


class VocabularyOnly:
    """The runtime side of refsight's grammar check, on a vocabulary loaded without weights."""

    def __init__(self, path: str) -> None:
        params = L.llama_model_default_params()
        params.vocab_only = True
        self.model = L.llama_model_load_from_file(path.encode(), params)
        assert self.model, f"cannot load {path}"
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))

    def is_eog(self, token: int) -> bool:
        return bool(L.llama_vocab_is_eog(self.vocab, token))

    def piece(self, token: int, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[: max(n, 0)]

    def tokenize(self, text: str, parse_special: bool, add_special: bool = False) -> list[int]:
        data = text.encode()
        out = (L.llama_token * (len(data) + 8))()
        n = L.llama_tokenize(self.vocab, data, len(data), out, len(out), add_special, parse_special)
        return list(out[: max(n, 0)])

    def check_grammar(self, grammar: str) -> None:
        """llama.cpp's parse is the worker's own step (``parsed``), not part of the vocabulary check."""


def _run(vocab: VocabularyOnly, grammar: CheckedGrammar, sampler, rng: random.Random) -> str:
    """Up to STEPS tokens: the grammar applied to every token with random logits, the best one it allows
    accepted as refsight's sampler does (never a token at -inf; refsight's stacks first)."""
    n = vocab.n_vocab
    data = (L.llama_token_data * n)()
    try:
        stacks = GrammarStacks(grammar)
        for _ in range(STEPS):
            for token in range(n):
                data[token] = L.llama_token_data(token, rng.uniform(-5, 5), 0.0)
            L.llama_sampler_apply(sampler, ctypes.byref(L.llama_token_data_array(data, n, -1, False)))
            allowed = [t for t in range(n) if data[t].logit != float("-inf")]
            if not allowed:
                return "complete" if stacks.complete else "stuck"
            token = max(allowed, key=lambda t: data[t].logit)
            stacks.accept(token, vocab.piece(token, True), vocab.is_eog(token))
            if vocab.is_eog(token):
                return "complete"
            L.llama_sampler_accept(sampler, token)
    except InvalidInputError as e:
        return f"refused: {e.reason}"
    return "steps"


def main(path: str) -> None:
    L.llama_log_set(_quiet, ctypes.c_void_p(0))
    vocab = VocabularyOnly(path)
    for line in sys.stdin:
        case = json.loads(line)
        answer: dict[str, object] = {"vocabulary": None, "parsed": False, "end": None}
        try:
            checked = check_grammar(vocab, case["grammar"], bounded=case.get("bounded", True))
        except InvalidInputError as e:
            answer["vocabulary"] = e.reason
        else:
            sampler = L.llama_sampler_init_grammar(vocab.vocab, case["grammar"].encode(), b"root")
            answer["parsed"] = bool(sampler)
            if sampler:
                answer["end"] = _run(vocab, checked, sampler, random.Random(case.get("seed", 0)))
                L.llama_sampler_free(sampler)
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
