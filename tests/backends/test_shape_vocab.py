"""The ``shape-*`` models' vocabulary: a verdict in a few dozen tokens, hashed into the build id."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import torch

from refsight.builtin_models import checkpoints
from refsight.builtin_models.shape_vocab import Vocabulary, shape_vocabulary
from refsight.builtin_models.tokenizer import smolvlm_special_tokens, train_tokenizer
from refsight.demo import DEMO_EVIDENCE_CHARS, DEMO_RUBRIC
from refsight.inputs.rubric import parse_rubric
from refsight.judge.verdict import verdict_schema


def _tokenizer(vocabulary: Vocabulary | None):
    return train_tokenizer(smolvlm_special_tokens(), eos_token="<end_of_utterance>", pad_token="<|endoftext|>",
                           vocabulary=vocabulary)


@pytest.fixture(scope="module")
def shape_tokenizer():
    return _tokenizer(shape_vocabulary())


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return _tokenizer(None)


def _verdict(texts: list[str]) -> str:
    return json.dumps({"criteria": [
        {"criterion": t, "verdict": "match", "confidence": 0.9, "evidence": "same fur"} for t in texts
    ]})


def test_a_verdict_is_a_few_dozen_tokens_where_the_tiny_vocabulary_spells_it_out(shape_tokenizer, tiny_tokenizer):
    verdict = _verdict(parse_rubric(DEMO_RUBRIC).texts)
    assert len(shape_tokenizer) == shape_vocabulary().size == 4096 and len(tiny_tokenizer) == 512
    ids = shape_tokenizer(verdict, add_special_tokens=False)["input_ids"]
    assert shape_tokenizer.decode(ids) == verdict  # lossless: merges across words still decode byte for byte
    assert len(ids) <= 40 < 150 <= len(tiny_tokenizer(verdict, add_special_tokens=False)["input_ids"])
    # Criteria it never saw still tokenize (byte-level), only in more pieces.
    unseen = _verdict(["a zebra crossing in the rain"])
    assert shape_tokenizer.decode(shape_tokenizer(unseen, add_special_tokens=False)["input_ids"]) == unseen


def _constrained_steps(tokenizer, schema: dict, seed: int) -> int:
    """Decode steps of a random-logits model constrained to ``schema`` (what a random-weight model does)."""
    from refsight.backends.hf.constrained import make_json_logits_processor

    generator = torch.Generator().manual_seed(seed)
    processor = make_json_logits_processor(tokenizer, schema, len(tokenizer))
    ids = torch.zeros(1, 1, dtype=torch.long)
    for step in range(1, 1000):
        scores = processor(ids, torch.randn(1, len(tokenizer), generator=generator))
        token = int(scores.argmax())
        if token == tokenizer.eos_token_id:
            return step
        ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    raise AssertionError("the grammar never completed")


def test_a_random_weight_model_writes_the_demo_verdict_in_few_steps(shape_tokenizer, tiny_tokenizer):
    # Random logits pick any allowed token: the step count a random-weight shape model pays per verdict.
    schema = verdict_schema(parse_rubric(DEMO_RUBRIC).criteria, evidence_max_chars=DEMO_EVIDENCE_CHARS)
    shape = [_constrained_steps(shape_tokenizer, schema, seed) for seed in range(4)]
    spelled = [_constrained_steps(tiny_tokenizer, schema, seed) for seed in range(4)]
    assert max(shape) <= 90 and min(spelled) >= 150, (shape, spelled)


def test_the_shape_build_id_hashes_the_vocabulary_and_tiny_ids_hash_their_fields(monkeypatch):
    import transformers

    name = "shape-smolvlm-256m"
    before = checkpoints._build_id(name)
    spec = checkpoints.TINY_MODELS[name]
    other = dataclasses.replace(spec.vocabulary, corpus=spec.vocabulary.corpus + "\nmore words")
    monkeypatch.setitem(checkpoints.TINY_MODELS, name, dataclasses.replace(spec, vocabulary=other))
    assert checkpoints._build_id(name) != before  # a cached build of another corpus is rebuilt, not reused

    # tiny-* models have no vocabulary: their ids hash exactly the fields they hashed before it existed,
    # plus the version of the processor files where refsight writes them (a finish hook writes its own).
    for tiny_name, tiny_spec in checkpoints.TINY_MODELS.items():
        if tiny_name.startswith("tiny-"):
            assert tiny_spec.vocabulary is None
            fields = {k: v for k, v in tiny_spec.__dict__.items() if k not in ("finish", "save_dtype", "vocabulary") or v}
            recipe = {"spec": fields, "seed": checkpoints.SEED, "build": checkpoints.BUILD_VERSION, "transformers": transformers.__version__}
            if not tiny_spec.finish:
                recipe["processor_files"] = checkpoints.PROCESSOR_FILES_VERSION
            text = json.dumps(recipe, sort_keys=True, default=str)
            assert checkpoints._build_id(tiny_name) == hashlib.sha256(text.encode()).hexdigest()[:12]
