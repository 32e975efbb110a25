"""benchmarks/prefix_cache_runtimes.py runs on a llama.cpp model and prints one JSON line (small images here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from llama_models import require_llama_cpp

require_llama_cpp()

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "prefix_cache_runtimes.py"


def test_prefix_cache_benchmark_on_a_gguf_model(gguf, capsys):
    gguf("tiny-qwen2-vl-gguf")  # built before the timed part
    spec = importlib.util.spec_from_file_location("prefix_cache_runtimes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(["--model", "tiny-qwen2-vl-gguf", "--size", "84", "--refs", "2"])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line == json.loads(json.dumps(result))
    assert line["tokens_equal"] is True
    assert line["prefix_hits"] == 5  # 2 candidates x 3 rubrics: the first builds the state
    for key in ("fresh_ms", "package_ms", "prefix_ms", "candidate_only_ms_each", "prefix_bytes_per_token"):
        assert line[key] > 0, key
