"""Each token's log probability (``Sampling.logprobs``, issue 51): one computation for every backend.

:func:`~refsight.backends.logprobs.token_logprob` is a log-softmax over a step's raw logits with
the most likely tokens, most likely first; the transformers backend reports it per token of an
answer without changing a token, and refuses it by name when streaming (a streamer sees no logits).
The llama.cpp path and the dialects' shapes are tested over HTTP (tests/server/test_llama_server_round3.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from refsight.backends.logprobs import token_logprob
from refsight.sampling import Sampling
from refsight.errors import InvalidInputError
from refsight.results import MAX_LOGPROBS, GenerateResult, TokenLogprob


def test_a_token_logprob_is_a_log_softmax_with_the_most_likely_first():
    row = np.array([1.0, 3.0, 3.0, -2.0, 0.5], dtype=np.float32)
    lp = token_logprob(row, 4, 3, lambda t: bytes([97 + t]))
    expected = row.astype(np.float64) - math.log(np.exp(row.astype(np.float64)).sum())
    assert lp.token == 4 and lp.piece == b"e" and lp.logprob == pytest.approx(expected[4])
    assert [t for t, _, _ in lp.top] == [1, 2, 0]  # ties by the lower id
    assert sum(math.exp(v) for v in expected) == pytest.approx(1.0)
    assert token_logprob(row, 0, 0, lambda t: b"").top == ()
    assert len(token_logprob(row, 0, 50, lambda t: b"").top) == 5  # never more than the vocabulary


def test_logprobs_are_bounded_and_json_ready():
    for bad in (-1, MAX_LOGPROBS + 1, True, 1.5):
        with pytest.raises(InvalidInputError) as e:
            Sampling(logprobs=bad)
        assert e.value.input == "logprobs"
    lp = TokenLogprob(5, b"\xe2\x82", float("-inf"), ((5, b"\xe2\x82", float("-inf")),))
    result = GenerateResult("x", [5], "m", False, [], {}, logprobs=[lp])
    data = result.to_dict()["logprobs"][0]
    assert math.isfinite(data["logprob"]) and data["top"][0]["text"] == "\ufffd"


@pytest.mark.slow  # a tiny transformers model
def test_a_transformers_answer_reports_its_tokens_logprobs_and_refuses_them_streamed(load, photos):
    from refsight.requests import GenerationRequest

    backend = load("tiny-qwen2-vl")

    def request(sampling):
        return GenerationRequest([photos["chelsea"], "Describe it."], max_new_tokens=4, sampling=sampling)

    plain, probed = backend.generate([request(Sampling()), request(Sampling(logprobs=2))])
    assert probed.token_ids == plain.token_ids and plain.logprobs is None
    assert [lp.token for lp in probed.logprobs] == probed.token_ids
    assert all(lp.logprob <= 0 and len(lp.top) == 2 and lp.top[0][0] == lp.token for lp in probed.logprobs)
    with pytest.raises(InvalidInputError) as e:
        backend.generate_stream(request(Sampling(logprobs=2)), on_text=lambda text: None)
    assert e.value.input == "logprobs"
