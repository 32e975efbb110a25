"""llguidance-constrained decoding on a real (tiny, random-weight) transformers causal LM.

A random model has no idea what JSON is: every valid answer here is the grammar's doing.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from runtimes import require_module

from refsight.inputs.rubric import parse_rubric
from refsight.judge.verdict import parse_verdicts, token_budget, verdict_schema

require_module("llguidance")
constrained = require_module("refsight.backends.hf.constrained")

WORDS = (
    "cat dog orange striped fur ears pointed round white paws tail eyes green blue same colour pattern "
    "whiskers collar background window wooden chair size pose sitting lying label logo scratch dent stain"
).split()
ODD = ['"quoted"', "back\\slash", "naïve", "猫", "50%", "a/b", "{braces}", "tab\tin", "emoji 😀"]


def make_rubrics(n: int, seed: int = 0) -> list:
    """``n`` distinct rubrics: 1-4 criteria of 1-6 words, some with quotes, escapes and non-ASCII."""
    rng = random.Random(seed)
    rubrics, seen = [], set()
    while len(rubrics) < n:
        criteria = []
        for _ in range(rng.randint(1, 4)):
            words = rng.sample(WORDS, rng.randint(1, 6))
            if rng.random() < 0.3:
                words.insert(rng.randrange(len(words) + 1), rng.choice(ODD))
            criteria.append(" ".join(words))
        try:
            rubric = parse_rubric([{"text": c, "weight": rng.choice([1, 2, 0.5])} for c in criteria])
        except Exception:  # a duplicate drawn twice: draw again
            continue
        if rubric.digest not in seen:
            seen.add(rubric.digest)
            rubrics.append(rubric)
    return rubrics


def generate(model, tokenizer, schemas, budgets, *, sample=False, seed=0, processor=None):
    import torch

    prompts = [f"Judge rubric {i}: answer in JSON." for i in range(len(schemas))]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    processor = processor or constrained.make_json_logits_processor(tokenizer, schemas, model.config.vocab_size)
    torch.manual_seed(seed)
    out = model.generate(
        **enc,
        max_new_tokens=max(budgets),
        do_sample=sample,
        temperature=1.5 if sample else None,
        top_k=0 if sample else None,
        logits_processor=[processor],
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    rows = []
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        # keep up to and including the first EOS (finished rows are padded after it)
        end = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        rows.append(row[:end])
    return rows


@pytest.mark.slow  # 200 constrained generations
def test_200_generated_rubrics_all_give_schema_valid_json(tiny_lm, byte_tokenizer, one_thread):
    """The issue's target: 200 rubrics, 100% valid. Half greedy, half sampled hot (wild tokens)."""
    tok = byte_tokenizer
    evidence = 8
    rubrics = make_rubrics(200)
    valid = 0
    for start in range(0, len(rubrics), 20):
        batch = rubrics[start : start + 20]
        schemas = [verdict_schema(r.criteria, evidence_max_chars=evidence) for r in batch]
        budgets = [token_budget(r.criteria, evidence_max_chars=evidence) for r in batch]
        rows = generate(tiny_lm, tok, schemas, budgets, sample=start % 40 == 20, seed=start)
        for rubric, schema, budget, row in zip(batch, schemas, budgets, rows):
            assert row[-1] == tok.eos_token_id, "stopped by the length limit, not by the grammar"
            assert len(row) <= budget
            text = tok.decode(row, skip_special_tokens=True)
            data = json.loads(text)  # strict: no raw control characters either
            jsonschema.validate(data, schema)
            assert [v.criterion for v in parse_verdicts(text, rubric.criteria, schema)] == rubric.texts
            valid += 1
    assert valid == 200


def test_generation_stops_as_soon_as_the_grammar_is_complete(tiny_lm, byte_tokenizer, one_thread):
    rubric = parse_rubric("is a cat; orange fur")
    schema = verdict_schema(rubric.criteria, evidence_max_chars=8)
    budget = token_budget(rubric.criteria, evidence_max_chars=8)
    [row] = generate(tiny_lm, byte_tokenizer, [schema], [budget + 200])
    assert row[-1] == byte_tokenizer.eos_token_id and len(row) <= budget
    text = byte_tokenizer.decode(row[:-1])
    assert text.endswith("}]}") and json.loads(text)


def test_rows_without_a_schema_stay_free(tiny_lm, byte_tokenizer, one_thread):
    rubric = parse_rubric("is a cat")
    schema = verdict_schema(rubric.criteria, evidence_max_chars=8)
    free, bound = generate(tiny_lm, byte_tokenizer, [None, schema], [20, token_budget(rubric.criteria, evidence_max_chars=8)])
    json.loads(byte_tokenizer.decode(bound, skip_special_tokens=True))
    # the random model left alone does not write the schema's JSON
    assert not byte_tokenizer.decode(free, skip_special_tokens=True).startswith('{"criteria"')


def test_compiled_grammars_are_cached_per_tokenizer_and_schema(byte_tokenizer, tiny_lm):
    schema = verdict_schema(parse_rubric("cached criterion one").criteria)
    vocab = tiny_lm.config.vocab_size
    before = constrained.grammar_cache_info()
    g1 = constrained.compile_json_grammar(byte_tokenizer, schema, vocab)
    g2 = constrained.compile_json_grammar(byte_tokenizer, json.loads(json.dumps(schema)), vocab)
    after = constrained.grammar_cache_info()
    assert g1 is g2
    assert after["misses"] == before["misses"] + 1 and after["hits"] == before["hits"] + 1
    # a new processor per call shares the compiled grammar but not the matcher state
    p1 = constrained.make_json_logits_processor(byte_tokenizer, schema, vocab)
    p2 = constrained.make_json_logits_processor(byte_tokenizer, schema, vocab)
    assert p1 is not p2 and constrained.grammar_cache_info()["misses"] == after["misses"]


def test_a_processor_is_single_use_for_its_batch(byte_tokenizer, tiny_lm):
    import torch

    schema = verdict_schema(parse_rubric("x1").criteria)
    p = constrained.make_json_logits_processor(byte_tokenizer, [schema, schema], tiny_lm.config.vocab_size)
    scores = torch.zeros(2, tiny_lm.config.vocab_size)
    masked = p(torch.zeros(2, 3, dtype=torch.long), scores)
    allowed = torch.isfinite(masked)
    # only '{'-starting tokens are allowed first, and never the padding ids past the tokenizer
    first = {byte_tokenizer.decode([i]) for i in allowed[0].nonzero().flatten().tolist()}
    assert first and all(t.startswith("{") for t in first)
    assert not allowed[:, len(byte_tokenizer):].any()
    with pytest.raises(ValueError, match="batch changed"):
        p(torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, tiny_lm.config.vocab_size))


def test_bad_arguments_raise_value_errors(byte_tokenizer):
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        constrained.make_json_logits_processor(byte_tokenizer, {"type": "object"}, 10)
    with pytest.raises(ValueError, match="must be a dict"):
        constrained.compile_json_grammar(byte_tokenizer, "not a schema", len(byte_tokenizer))
    with pytest.raises(ValueError, match="cannot compile"):
        constrained.compile_json_grammar(byte_tokenizer, {"type": "no-such-type"}, len(byte_tokenizer))
    with pytest.raises(ValueError, match="stop_token_ids is empty"):
        constrained.make_json_logits_processor(byte_tokenizer, {"type": "object"}, len(byte_tokenizer), stop_token_ids=[])
    with pytest.raises(ValueError, match="2 schemas for a batch of 1"):
        import torch

        p = constrained.make_json_logits_processor(byte_tokenizer, [None, None], len(byte_tokenizer))
        p(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, len(byte_tokenizer)))


@pytest.mark.parametrize(
    "raw, ok",
    [
        (b'"a\\u00e9"', False),  # no escapes in bounded strings (keeps the token budget)
        (b'"tab\there"', False),  # raw control characters are invalid JSON
        (b'"\x1f"', False),
        (b'"\xe0\x92\xa0"', False),  # overlong UTF-8
        (b'"\xed\xa0\x80"', False),  # a surrogate
        (b'"abcdefg"', False),  # over maxLength
        ('"é猫😀 ok"'.encode(), True),
        (b'""', True),
    ],
)
def test_bounded_strings_are_strict_json(byte_tokenizer, raw, ok):
    grammar = constrained.compile_json_grammar(byte_tokenizer, {"type": "string", "maxLength": 6}, len(byte_tokenizer))
    matcher = grammar.matcher()
    assert (matcher.consume_tokens(grammar.tokenizer.tokenize_bytes(raw)) and matcher.is_accepting()) is ok


#: Schemas and answers on which the transformers grammar (llguidance) and the vLLM grammar
#: (xgrammar's EBNF, backends/vllm/grammar.py) must agree: separators, closed objects,
#: bounded numbers' decimals, bounded strings' characters.
AGREEMENT = [
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
     ['{"a": 1}', '{"a":1}', '{"a": 1, "b": 2}', '{ "a": 1}', '{"a": -1}']),
    ({"type": "number", "minimum": 0, "maximum": 1},
     ["0", "1", "0.5", "0.123456", "0.1234567", "1.5", "-0.1", "1e-3"]),
    ({"type": "string", "minLength": 2, "maxLength": 4},
     ['"ab"', '"a"', '"abcd"', '"abcde"', '"a\\"b"', '"é猫"']),
    ({"type": "array", "prefixItems": [{"type": "boolean"}], "items": False, "minItems": 1},
     ["[true]", "[true, false]", "[true,false]", "[]"]),
    ({"enum": ["match", "mismatch"]}, ['"match"', '"mism"', '"mismatch"']),
]


@pytest.mark.parametrize("schema, answers", AGREEMENT, ids=[str(i) for i in range(len(AGREEMENT))])
def test_the_transformers_and_vllm_grammars_accept_the_same_answers(byte_tokenizer, schema, answers):
    xgr = require_module("xgrammar")
    from refsight.backends.vllm.grammar import json_schema_ebnf

    info = xgr.TokenizerInfo.from_huggingface(byte_tokenizer, vocab_size=len(byte_tokenizer))
    xgrammar = xgr.GrammarCompiler(info).compile_grammar(xgr.Grammar.from_ebnf(json_schema_ebnf(schema)))
    grammar = constrained.compile_json_grammar(byte_tokenizer, schema, len(byte_tokenizer))
    for answer in answers:
        xgrammar_matcher = xgr.GrammarMatcher(xgrammar)
        by_xgrammar = xgrammar_matcher.accept_string(answer) and xgrammar_matcher.is_completed()
        matcher = grammar.matcher()
        by_llguidance = matcher.consume_tokens(grammar.tokenizer.tokenize_str(answer)) and matcher.is_accepting()
        assert by_llguidance == by_xgrammar, (answer, by_llguidance)
