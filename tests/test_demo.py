"""``refsight demo``: its figures come from the store's counters, so none can go negative, and its
ranking with random VLM weights comes from the parts that have real weights.

The end-to-end run uses the toy backend (it judges in milliseconds): what is asserted here is the
demo's arithmetic and wording; the cached == fresh equivalence of the real model paths is proven
in tests/backends.
"""

from __future__ import annotations

import json

from refsight.demo import cache_figures, real_ranking, run_demo


def test_cache_figures_are_counts_and_sums_that_cannot_go_negative():
    before = {"hits": 4, "encode_ms_saved": 100.0, "load_ms": 1.0, "prefix_hits": 0, "prefix_tokens_reused": 0,
              "prefix_ms_saved": 0.0}
    after = {"hits": 7, "encode_ms_saved": 250.0, "load_ms": 1.3, "prefix_hits": 3, "prefix_tokens_reused": 192,
             "prefix_ms_saved": 30.0}
    figures = cache_figures(before, after)
    assert figures["encodes_avoided"] == 3
    assert figures["encode_ms_per_reference"] == 50.0 and figures["load_ms_per_reference"] == 0.1
    assert figures["prefix_tokens_reused"] == 192 and figures["prefix_states_reused"] == 3
    # A counter that moved backwards (another process reset the store) reads as nothing, never as negative.
    assert all(v is None or v >= 0 for v in cache_figures(after, before).values())
    assert cache_figures(after, before)["encode_ms_per_reference"] is None  # no hit: no per-encode figure


def test_real_ranking_puts_settled_matches_first_and_settled_mismatches_last():
    def row(ref_id, recall, *settled):
        criteria = [{"criterion": c, "verdict": v, "source": "attributes"} for c, v in settled]
        return {"ref_id": ref_id, "recall_score": recall, "criteria": criteria + [
            {"criterion": "short fur", "verdict": "match", "source": "vlm"}]}  # a random-weight verdict: ignored

    result = {"results": [
        row("rocket", 0.9), row("coffee", 0.95, ("is a cat", "mismatch")), row("chelsea", 0.5, ("is a cat", "match")),
        {"ref_id": "horse", "recall_score": 0.3, "stage": "recalled"},
    ]}
    assert [r["ref_id"] for r in real_ranking(result)] == ["chelsea", "rocket", "horse", "coffee"]


def test_the_demo_ends_with_the_encodes_it_avoided_and_what_each_cost(tmp_path, capsys):
    store = tmp_path / "store"
    assert run_demo(store=str(store), model="toy") == 0
    lines = capsys.readouterr().out.strip().splitlines()
    closing = "\n".join(lines[-10:])
    # The last lines put the same comparison's wall times side by side, with the speed-ups.
    assert "The same comparison, wall time:" in closing
    assert "a) references re-encoded" in closing and "x faster" in closing
    assert "Cached == fresh: verdicts identical to the fresh path: True" in closing
    assert "Encodes avoided: 7 (each avoided encode had cost" in closing  # 3 + 3 references, the candidate once
    assert "loading its package instead took" in closing and "KV prefix reuse:" in closing
    # The last line's command runs with what is installed: the server extra is, so no install line follows it.
    assert lines[-1].startswith("Browse the references") and "pip install" not in lines[-1]

    assert run_demo(store=str(store), model="toy", as_json=True) == 0  # a second run: every reference cached
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["verdicts_identical"] and summary["all_references_cached"]
    assert summary["cache"]["encodes_avoided"] == 7
    assert set(summary["wall_s"]) == {"re_encoded", "cached", "new_rubric"} and set(summary["speedup"]) == {"cached", "new_rubric"}
    assert all(v is None or v >= 0 for v in summary["cache"].values())
    assert summary["ranking"][0] == "chelsea" or not summary["random_weights"]


def test_samples_writes_the_photos_a_new_cat_and_a_rubric_that_parses(tmp_path, capsys):
    from refsight.cli import main
    from refsight.inputs.rubric import parse_rubric

    assert main(["samples", str(tmp_path / "photos")]) == 0
    assert "wrote 9 files" in capsys.readouterr().out
    names = sorted(p.name for p in (tmp_path / "photos").iterdir())
    assert names == sorted(["chelsea.jpg", "astronaut.jpg", "coffee.jpg", "rocket.jpg", "horse.png", "china.jpg",
                            "flower.jpg", "new.jpg", "rubric.yaml"])
    assert (tmp_path / "photos" / "new.jpg").read_bytes() != (tmp_path / "photos" / "chelsea.jpg").read_bytes()
    rubric = parse_rubric((tmp_path / "photos" / "rubric.yaml").read_text())
    assert rubric.texts == ["is a cat", "short fur", "triangular ears"] and rubric[0].required


def test_the_demo_draws_no_progress_bars_when_its_output_is_not_a_terminal(tmp_path):
    # As a user piping it to a file or a CI log sees it: figures, no bar redraws (carriage returns).
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "refsight.cli", "demo", "--store", str(tmp_path / "store"), "--model", "toy"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "\r" not in done.stderr and "%|" not in done.stderr
    assert "Encodes avoided" in done.stdout


def test_without_real_weights_the_demo_uses_a_real_size_vision_tower(monkeypatch):
    import refsight.demo as demo

    monkeypatch.setattr(demo, "_real_model_available", lambda name: False)
    said: list[str] = []
    assert demo._choose_model(None, said.append) == "shape-smolvlm-256m" == demo.FALLBACK_DEMO_MODEL
    assert "RANDOM weights" in said[0]



def test_the_serve_line_the_demo_prints_answers_its_references_from_the_cache(tmp_path, monkeypatch):
    # The hand-off a new user makes: the demo fills its store with its model's options (written into the store's
    # refsight.toml), then the `refsight serve` line it prints, run as printed (on a free port), must find those
    # packages: no encode, the reference's image tokens counted as cached. tiny-smolvlm stands in for the demo's
    # model (the same family and tiling; its default is 2×2 tiles, one 32² tile with these options) so the test
    # costs seconds; the demo model's own options reaching `serve` is the test below.
    import shlex

    import httpx

    from hardening_helpers import ServeProcess
    from refsight import demo
    from refsight.samples import sample_paths

    monkeypatch.setitem(demo.DEMO_OPTIONS, "tiny-smolvlm", {"max_pixels": 32 * 32})
    store = tmp_path / "demo"
    with demo.demo_engine(store, "tiny-smolvlm") as engine:  # the demo's first step, on one photo
        assert engine.add(sample_paths()["chelsea"]).to_dict()["ref_id"] == "chelsea"
    line = demo.browse_hint(str(store), "tiny-smolvlm").partition(", then open")[0]
    assert line == f"refsight serve --store {store} --model tiny-smolvlm"
    server = ServeProcess(None, command=shlex.split(line))
    try:
        server.wait_ready(timeout=180)
        chat = {"model": "tiny-smolvlm", "max_tokens": 1, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "refsight://ref/chelsea"}}, {"type": "text", "text": "Who?"}]}]}
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=120)
        assert reply.status_code == 200, reply.text
        stats = httpx.get(f"{server.url}/v1/stats", timeout=10).json()
    finally:
        server.stop()
    body = reply.json()
    assert body["refsight"]["references_cached"] == [True]
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert stats["replica"]["misses"] == 0 and stats["replica"]["hits"] >= 1, stats  # no encode in the server


def test_the_demo_models_options_are_the_ones_its_serve_line_loads(tmp_path):
    # No model loads: the options the demo's engine encodes with, and those the printed `refsight serve` line's
    # flags and the store's refsight.toml give the same model, are one and the same (one 512² tile an image).
    import shlex

    from refsight.cli import _resolve_store_options, build_parser
    from refsight.cli.command import backend_options, settings_of
    from refsight.demo import DEMO_OPTIONS, FALLBACK_DEMO_MODEL, FALLBACK_MAX_PIXELS, browse_hint, demo_engine

    store = tmp_path / "demo"
    with demo_engine(store, FALLBACK_DEMO_MODEL) as engine:
        used = engine.models.options(FALLBACK_DEMO_MODEL)
    assert used.max_pixels == FALLBACK_MAX_PIXELS == DEMO_OPTIONS[FALLBACK_DEMO_MODEL]["max_pixels"]
    args = build_parser().parse_args(shlex.split(browse_hint(str(store), FALLBACK_DEMO_MODEL).partition(",")[0])[1:])
    _resolve_store_options(args)  # as `refsight` does before any command
    assert settings_of(args).backend_options(args.model, backend_options(args)) == used
