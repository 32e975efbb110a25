"""`refsight add --model tiny-...` and `refsight generate`: cached and --no-cache give the same tokens."""

from __future__ import annotations

import json

from refsight.cli import main


def test_generate_from_cached_references_matches_the_fresh_path(cli_store, capsys):
    store, candidate, added = cli_store
    assert [a["cached"] for a in added] == [False, False] and all(a["model"] == "tiny-qwen2-vl" for a in added)

    argv = [
        "generate",
        "--ref",
        "chelsea",
        "--ref",
        "coffee",
        "--image",
        str(candidate),
        "--prompt",
        "Which is closer?",
        "--store",
        str(store),
        "--model",
        "tiny-qwen2-vl",
        "--max-new-tokens",
        "12",
        "--json",
    ]
    assert main(argv) == 0
    cached = json.loads(capsys.readouterr().out)
    assert main(argv + ["--no-cache"]) == 0
    fresh = json.loads(capsys.readouterr().out)

    assert set(cached) == {
        "text", "tokens", "model", "random_weights", "references_cached", "timings_ms", "prompt_tokens", "cached_tokens",
        "finish_reason", "prefix_tokens_reused",
    }
    assert cached["random_weights"] is True and cached["model"] == "tiny-qwen2-vl"
    assert cached["references_cached"] == [True, True, False]  # two references, then the fresh candidate
    assert fresh["references_cached"] == [False, False, False]
    assert cached["tokens"] == fresh["tokens"] and cached["text"] == fresh["text"]
    assert len(cached["tokens"]) > 0

    # Without --json the random-weight label goes to stderr beside the text.
    assert main(argv[:-1]) == 0
    captured = capsys.readouterr()
    assert "RANDOM weights" in captured.err and "random weights" in captured.out
