"""The KV prefix cache through the front ends: engine compare, CLI generate / stats (server: tests/server).

The judge and ``generate`` reuse the references' prefix state by default; ``prefix_states=False``
(``--no-prefix-states``, ``"prefix_states": false``) prefills it afresh with the same answer; the
counters show in ``stats`` and Prometheus.
"""

from __future__ import annotations

import json

import pytest

from refsight import Engine
from refsight.cli import main

RUBRIC_A = "striped fur\npointed ears"
RUBRIC_B = "same colour"


def _counts(engine: Engine) -> dict:
    stats = engine.stats()
    return {"hits": stats.prefix_hits, "misses": stats.prefix_misses}


@pytest.mark.slow  # judges a real photo under several rubrics
def test_compare_reuses_the_reference_prefix_across_rubrics_with_the_same_verdicts(tmp_path, real_photo):
    with Engine(tmp_path / "store", model="tiny-qwen2-vl") as engine:
        engine.add(real_photo("chelsea", size=(64, 48)), ref_id="chelsea")
        candidate = real_photo("astronaut", size=(56, 56))
        # Short evidence keeps the constrained answers (and the test) short.
        run = lambda rubric, **kw: engine.compare(  # noqa: E731
            candidate, criteria=rubric, ref_ids=["chelsea"], attributes=(), evidence_max_chars=4, **kw
        ).to_dict()["results"]
        run(RUBRIC_A)
        assert _counts(engine) == {"hits": 0, "misses": 1}
        second = run(RUBRIC_B)
        assert _counts(engine) == {"hits": 1, "misses": 1}  # another rubric: no prefill over the reference
        assert run(RUBRIC_B, prefix_states=False) == second
        assert _counts(engine) == {"hits": 1, "misses": 1}  # opted out: the store was not asked
        assert engine.stats().prefix_bytes > 0 and engine.stats().prefix_ms_saved > 0


def test_cli_generate_reuses_the_state_and_no_prefix_states_opts_out(cli_store, capsys):
    store, candidate, _ = cli_store

    def generate(prompt: str, *flags: str) -> dict:
        argv = ["generate", "--ref", "chelsea", "--ref", "coffee", "--image", str(candidate), "--prompt", prompt,
                "--store", str(store), "--model", "tiny-qwen2-vl", "--max-new-tokens", "8", "--json", *flags]
        assert main(argv) == 0
        return json.loads(capsys.readouterr().out)

    built = generate("Which is closer?")
    served = generate("Same animal?")
    opted_out = generate("Same animal?", "--no-prefix-states")
    assert built["prefix_tokens_reused"] == 0 and "prefix_build" in built["timings_ms"]
    assert served["prefix_tokens_reused"] > 0 and served["timings_ms"]["prefix_build"] == 0
    assert opted_out["prefix_tokens_reused"] == 0 and "prefix_load" not in opted_out["timings_ms"]
    assert opted_out["tokens"] == served["tokens"]
    assert main(["stats", "--store", str(store), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["prefix_hits"] == 1 and stats["prefix_misses"] == 1
    assert stats["prefix_bytes"] > 0 and stats["prefix_ms_saved"] > 0
