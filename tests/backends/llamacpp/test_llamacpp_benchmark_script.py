"""benchmarks/cache_speedup.py runs on a llama.cpp model and prints one JSON line (small images here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from llama_models import require_llama_cpp

require_llama_cpp()

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "cache_speedup.py"


def test_cache_speedup_on_a_gguf_model(gguf, capsys):
    gguf("tiny-qwen2-vl-gguf", n_threads=2)  # built before the timed part
    spec = importlib.util.spec_from_file_location("cache_speedup", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(["--model", "tiny-qwen2-vl-gguf", "--size", "112", "--refs", "1,2", "--max-new-tokens", "3"])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line == json.loads(json.dumps(result))
    for key in ("reference_encode_ms", "reference_load_ms", "ref_side_ratio", "fresh_ms", "cached_ms", "peer_ms", "speedup"):
        assert line[key] > 0, key
    assert all(run["tokens_equal"] for run in line["runs"])
