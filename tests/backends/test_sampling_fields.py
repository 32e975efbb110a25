"""``top_k``, ``min_p`` and ``repetition_penalty`` on the transformers path mean what transformers means:
the SamplingProcessor against transformers' own logits processors on the same logits."""

from __future__ import annotations

import pytest
from runtimes import require_module

from refsight.sampling import Sampling


def _torch():
    require_module("transformers")
    import torch

    return torch


@pytest.mark.parametrize("penalty", [0.7, 1.3, 2.0])
def test_repetition_penalty_equals_transformers_processor(penalty):
    torch = _torch()
    from transformers import RepetitionPenaltyLogitsProcessor

    from refsight.backends.hf.decoding import SamplingProcessor

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (1, 30), generator=generator)
    scores = torch.randn(1, 50, generator=generator)
    ours = SamplingProcessor([Sampling(repetition_penalty=penalty)], prompt_length=10, device="cpu")(ids, scores)
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(ids, scores.clone())
    assert torch.equal(ours, theirs)


def test_top_k_and_min_p_keep_the_tokens_transformers_keeps():
    torch = _torch()
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper

    from refsight.backends.hf.decoding import _distribution

    generator = torch.Generator().manual_seed(1)
    for _ in range(20):
        logits = torch.randn(200, generator=generator) * 3
        sampling = Sampling(temperature=0.8, top_k=12, min_p=0.05)
        ours = _distribution(logits, sampling)
        warped = logits[None].double()
        for warper in (TemperatureLogitsWarper(0.8), TopKLogitsWarper(12), MinPLogitsWarper(0.05)):
            warped = warper(None, warped)
        theirs = torch.softmax(warped[0], dim=-1)
        assert torch.equal(ours > 0, theirs > 0)
        assert torch.allclose(ours / ours.sum(), theirs, atol=1e-12)


def test_the_declared_ranges_are_refused_by_name():
    from refsight import InvalidInputError

    for fields, name in (({"top_k": -1}, "top_k"), ({"min_p": 1.5}, "min_p"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
                         ({"repetition_penalty": 2.5}, "repetition_penalty"), ({"top_k": True}, "top_k")):
        with pytest.raises(InvalidInputError) as info:
            Sampling(**fields)
        assert info.value.input == name
    assert Sampling(top_k=3, min_p=0.1, repetition_penalty=1.1).non_default() == ["top_k", "min_p", "repetition_penalty"]


def test_a_left_padded_row_is_penalised_as_the_unpadded_one():
    torch = _torch()
    from refsight.backends.hf.decoding import SamplingProcessor

    generator = torch.Generator().manual_seed(2)
    pad = 0
    row = torch.randint(1, 50, (1, 12), generator=generator)
    padded = torch.cat([torch.full((1, 5), pad), row], dim=1)
    scores = torch.randn(1, 50, generator=generator)
    sampling = [Sampling(repetition_penalty=1.5)]
    alone = SamplingProcessor(sampling, prompt_length=8, device="cpu", pad_id=pad)(row, scores.clone())
    with_pads = SamplingProcessor(sampling, prompt_length=13, device="cpu", pad_id=pad)(padded, scores.clone())
    assert torch.equal(alone, with_pads) and alone[0, pad] == scores[0, pad]


@pytest.mark.parametrize("window", [1, 7, 64])
def test_a_windowed_repetition_penalty_counts_the_last_text_tokens_alone(window):
    # llama.cpp's repeat_last_n: transformers' rule over the last `window` tokens that are not an image's.
    torch = _torch()
    from transformers import RepetitionPenaltyLogitsProcessor

    from refsight.backends.hf.decoding import SamplingProcessor

    generator = torch.Generator().manual_seed(3)
    image = 49
    ids = torch.randint(0, 49, (1, 30), generator=generator)
    ids[0, 20:24] = image  # an image inside the window: its tokens take no place in it
    scores = torch.randn(1, 50, generator=generator)
    sampling = [Sampling(repetition_penalty=1.5, repeat_last_n=window)]
    ours = SamplingProcessor(sampling, prompt_length=10, device="cpu", image_ids=[image])(ids, scores.clone())
    text = ids[ids != image][None]
    theirs = RepetitionPenaltyLogitsProcessor(1.5)(text[:, -window:], scores.clone())
    assert torch.equal(ours, theirs)
    off = SamplingProcessor([Sampling(repetition_penalty=1.5, repeat_last_n=0)], 10, "cpu")(ids, scores.clone())
    assert torch.equal(off, scores)


def test_repeat_last_n_is_read_as_llama_server_and_ollama_read_it():
    assert Sampling.merged({"repeat_last_n": 64}).non_default() == []  # no penalty: the window cannot matter
    assert Sampling.merged({"repeat_last_n": 64, "repetition_penalty": 1.1}).repeat_last_n == 64
    off = Sampling.merged({"repeat_last_n": 0}, {"repetition_penalty": 1.1})  # 0: the penalty is off
    assert off.repetition_penalty == 1.0 and off.non_default() == []
    assert Sampling.merged({"repeat_last_n": -1, "repetition_penalty": 1.1}).non_default() == ["repetition_penalty"]
    from refsight import InvalidInputError

    with pytest.raises(InvalidInputError, match="repeat_last_n"):
        Sampling(repetition_penalty=1.1, repeat_last_n=-2)


def test_vllm_refuses_a_window_only_where_it_would_change_the_answer():
    # vLLM's repetition penalty has no window: refused by name while the penalty is on, taken when it is off.
    from refsight.backends.vllm.backend import VLLMBackend

    def refused(**given):
        return Sampling.merged(given).unsupported(VLLMBackend.sampling_fields)

    assert refused(repetition_penalty=1.1, repeat_last_n=64) == ["repeat_last_n"]
    assert refused(repetition_penalty=1.1, repeat_last_n=0) == refused(repeat_last_n=64) == []
    assert refused(repetition_penalty=1.1, repeat_last_n=-1) == []
