"""Every grammar refsight's GBNF check takes, llama.cpp's own parser takes and its sampler runs without a crash.

A seeded generator writes grammars of every construct llama.cpp's grammar language has (literals and
classes with each escape, ``.``, references, groups, token references, the five repetitions, comments,
CRLF) and the hazards around them (NUL and surrogate escapes, code points past U+10FFFF, backwards
ranges, classes matching nothing, undefined rules, left recursion plain and hidden, endless rules,
deep nesting, huge counts), then mutates some of them a character at a time. Each one
:func:`~refsight.inputs.gbnf.check_gbnf` takes goes to the real llama.cpp in a worker process
(``_llamacpp_grammar_worker.py``: the tiny GGUF's vocabulary): its token references checked against the
vocabulary as the backend does, then llama.cpp's parser, then a dozen steps of its sampler over every
token. A crash of the worker is a failed test naming the grammar; so is a grammar llama.cpp refuses, and
one its sampler cannot go on from. llama.cpp's own ``grammars/*.gbnf`` and llama-cpp-python's JSON-schema
converter output go the same way.
"""

from __future__ import annotations

import json
import random
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hardening_helpers import cli_env
from llama_models import require_llama_cpp

from refsight import InvalidInputError
from refsight.inputs.gbnf import check_gbnf, read_gbnf


HERE = Path(__file__).parent
GRAMMARS = Path(__file__).parents[2] / "data" / "llama_cpp_grammars"
MODEL = "tiny-qwen2-vl-gguf"
SEED, COUNT, SECONDS = 20260, 3000, 20.0

# Each pool: what a sound grammar uses, then the hazards a grammar may carry (drawn at the grammar's hazard rate).
_CHARS = (["a", "b", "z", " ", "é", "中", "😀", "-", "^", "\\\\", '\\"', "\\n", "\\t", "\\r", "\\[", "\\]", "\\-",
           "\\x41", "\\x7f", "\\u00e9", "\\U0001F600", "\\U0010FFFF", "\\x01"],
          ["\\x00", "\\u0000", "\\uD800", "\\U00110000", "\\q", "\\x4", "\\U0000000", "]"])
_TOKENS = (["<[5]>", "<[97]>", "!<[5]>", "<[300]>", "!<|im_end|>", "<|im_start|>"],
           ["<[511]>", "<[512]>", "<[4294967295]>", "<[4294967296]>", "<|im_end|>", "<think>", "<[x]>", "<[7]"])
_REPEATS = (["", "", "", "", "*", "+", "?", "{2}", "{0,3}", "{1,}", "{ 2 , 5 }", "{0}", "{1,1}"],
            ["{3,1}", "{2001}", "{0,2001}", "{40}{60}", "?*", "{,2}", "{99999999999}"])
_NAMES = ["root", "a", "b", "c-d", "e1"]


class _Writer:
    """Random grammar text, one construct at a time, nesting bounded; each draw a hazard at ``hazard``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.hazard = 0.0

    def pick(self, pool: tuple[list[str], list[str]]) -> str:
        return self.rng.choice(pool[1] if self.rng.random() < self.hazard else pool[0])

    def grammar(self) -> str:
        rng = self.rng
        self.hazard = rng.choice([0.0, 0.0, 0.0, 0.02, 0.1])
        names = ["root", *rng.sample(_NAMES[1:], rng.randint(0, 3))]
        if rng.random() < self.hazard:
            names[0] = "item"  # no root
        rules = [f"{name} ::= {self.alternatives(names[k:], 0)}" for k, name in enumerate(names)]
        text = ("\r\n" if rng.random() < 0.1 else "\n").join(rules)
        if rng.random() < 0.1:
            text = "# a comment\n" + text + "  # trailing"
        if rng.random() < 0.05:
            depth = rng.choice([40, 1024, 1025, 3000])
            text += f"\nwrap ::= {'(' * depth}\"a\"{')' * depth}"
        return text

    def alternatives(self, names: list[str], depth: int) -> str:
        joiner = self.rng.choice([" | ", " | ", "|", " |\n  "])
        return joiner.join(self.sequence(names, depth) for _ in range(self.rng.randint(1, 3)))

    def sequence(self, names: list[str], depth: int) -> str:
        return " ".join(self.item(names, depth) + self.pick(_REPEATS) for _ in range(self.rng.randint(1, 4)))

    def item(self, names: list[str], depth: int) -> str:
        rng = self.rng
        kind = rng.choice(["literal", "literal", "class", "class", "ref", "ref", "group", "any", "token"])
        if kind == "group" and depth < 3:
            return f"({self.alternatives(names, depth + 1)})"
        if kind == "ref":  # mostly a later rule (``names`` starts at this one); now and then any: recursion
            if rng.random() < self.hazard:
                return "zz"
            return rng.choice(names[1:] or names) if rng.random() < 0.8 else rng.choice(_NAMES[:len(names) + 1])
        if kind == "token":
            return self.pick(_TOKENS)
        if kind == "any":
            return "."
        if kind == "class":
            members = "".join(self.member() for _ in range(rng.randint(1, 3)))
            return f"[{'^' if rng.random() < 0.3 else ''}{members}]"
        return '"' + "".join(self.pick(_CHARS) for _ in range(rng.randint(1, 4))) + '"'

    def member(self) -> str:
        """One member of a class: a character, or a range (its ends in order unless drawn as a hazard)."""
        rng = self.rng
        if rng.random() < 0.6:
            return self.pick(_CHARS)
        if rng.random() < self.hazard:
            return f"{self.pick(_CHARS)}-{self.pick(_CHARS)}"
        return rng.choice(["a-z", "0-9", "\\x01-\\x1f", "\\u00c0-\\u00ff", "\\x20-\\U0010FFFF", "\\x00-\\x1F", "中-\\u9fff"])


def _mutate(rng: random.Random, text: str) -> str:
    at = rng.randrange(len(text) + 1)
    if rng.random() < 0.5:
        return text[:at] + rng.choice('()[]"|*+?{},:=<>!\\# \n^-.a') + text[at:]
    return text[:at] + text[at + 1:]


def generated(seed: int, count: int) -> list[str]:
    """``count`` grammars from ``seed``: written, and a fifth of them mutated once."""
    rng = random.Random(seed)
    writer = _Writer(rng)
    out = []
    for _ in range(count):
        text = writer.grammar()
        out.append(_mutate(rng, text) if rng.random() < 0.2 else text)
    return out


class _Worker:
    """The llama.cpp worker process; :meth:`ask` one grammar, a crash or a hang asserted on with the grammar."""

    def __init__(self, model: Path) -> None:
        self.process = subprocess.Popen([sys.executable, str(HERE / "_llamacpp_grammar_worker.py"), str(model)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, env=cli_env())

    def ask(self, grammar: str, *, bounded: bool = True, seed: int = 0) -> dict:
        self.process.stdin.write(json.dumps({"grammar": grammar, "bounded": bounded, "seed": seed}) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], 30)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.process.kill()
            raise AssertionError(f"llama.cpp {'hung' if not ready else 'crashed'} (exit {self.process.wait()}) on "
                                 f"{grammar!r}:\n{self.process.stderr.read()[-2000:]}")
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0, self.process.stderr.read()[-2000:]


@pytest.fixture(scope="module")
def worker(model_cache):
    require_llama_cpp()
    from refsight.builtin_models.gguf import ensure_gguf

    process = _Worker(ensure_gguf(MODEL)[0])
    yield process
    process.close()


def _runs(worker: _Worker, grammar: str, **options) -> None:
    answer = worker.ask(grammar, **options)
    assert answer["vocabulary"] is None, (grammar, answer)
    assert answer["parsed"] and answer["end"] in ("complete", "steps"), (grammar, answer)


def test_every_generated_grammar_the_check_takes_runs_on_llama_cpp(worker):
    began, taken, refused, vocabulary, ambiguous, seen = time.monotonic(), 0, 0, 0, 0, 0
    for k, grammar in enumerate(generated(SEED, COUNT)):
        if time.monotonic() - began > SECONDS:  # CI's time is bounded; the seed keeps the order
            break
        seen += 1
        try:
            check_gbnf(grammar)
        except InvalidInputError as e:
            assert e.input == "grammar", e
            refused += 1
            continue
        answer = worker.ask(grammar, seed=k)
        if answer["vocabulary"] is not None:  # a token reference this vocabulary cannot take: refused, never run
            vocabulary += 1
            continue
        assert answer["parsed"], f"llama.cpp refused a grammar the check took: {grammar!r}"
        # Too ambiguous to follow: the request ends in a 400 before llama.cpp's stacks multiply. Nothing else.
        ambiguous += "too ambiguous" in answer["end"]
        assert answer["end"] in ("complete", "steps") or "too ambiguous" in answer["end"], (grammar, answer)
        taken += 1
    print(f"{taken} grammars ran on llama.cpp ({ambiguous} stopped as too ambiguous), {vocabulary} refused by the "
          f"vocabulary, {refused} by the check, {time.monotonic() - began:.1f} s")
    assert seen >= 300 and taken >= seen // 15 and refused >= seen // 3, (seen, taken, refused)


def test_llama_cpps_own_grammars_pass_and_run(worker):
    files = sorted(GRAMMARS.glob("*.gbnf"))
    assert len(files) == 8, files
    for path in files:
        grammar = path.read_text()
        assert check_gbnf(grammar) == grammar
        _runs(worker, grammar)


def test_the_json_schema_converters_grammars_pass_and_run(worker):
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from refsight.backends.llamacpp.grammar import schema_to_gbnf
    from refsight.inputs.json_schema import check_json_schema

    for schema in SCHEMAS:
        check_json_schema(schema)
        for grammar in (json_schema_to_gbnf(json.dumps(schema)), schema_to_gbnf(schema)):
            assert read_gbnf(grammar, "json_schema", bounded=False).tokens == []
            _runs(worker, grammar, bounded=False)


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
                                      "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5}},
     "required": ["name"]},
    {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(30)}},
    {"type": "string", "pattern": "^((a|b)c(d(e|f))){1,3}[0-9]{2,4}$"},
    {"type": "string", "pattern": "^[\\x01-\\x1f\\u00e9\\U0001F600]+$"},
    {"type": "string", "format": "date"}, {"type": "string", "format": "uuid"},
    {"enum": ["yes", "no", "maybe", 1, None, True]}, {"const": "tab\there \u00e9"},
    {"type": "number", "minimum": 0, "maximum": 1}, {"type": "integer", "minimum": -5, "maximum": 500},
    {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "number"}}]},
    {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "null"}], "minItems": 2},
    {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}}},
     "type": "array", "items": {"$ref": "#/$defs/point"}},
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"type": "string", "minLength": 3, "maxLength": 1000},
]
