"""benchmarks/parallel_slots.py runs end to end at a tiny size: two real ``refsight serve`` arms, C clients at once,
and llama-server's own ``-np 1`` and ``-np C`` (built from the vendored source when the machine has no cached copy)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runtimes import require_module

require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "parallel_slots.py"


@pytest.mark.timeout(2400)  # a first llama-server build takes ~11 min on 2 cores
def test_parallel_slots_prints_one_json_line_with_identical_answers(model_cache):
    args = ["--model", "tiny-qwen2-vl-gguf", "--size", "56", "--clients", "2", "--per-client", "1",
            "--working-set", "3", "--max-tokens", "6", "--peer"]
    result = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=2300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1  # one JSON line, nothing else on stdout
    line = json.loads(lines[0])
    assert line["throughput_ratio"] > 0 and line["requests"] == 2 and line["clients"] == 2
    assert line["answers_identical"] is True and line["flash_attn"] == "off"
    decode = line["decode"]  # the probe of what batching can win on this machine
    assert decode["rows_per_call"] == 1  # float weights: one sequence a call
    assert all(ms > 0 for ms in decode["ms_per_token"].values()) and decode["speedup_bound"] > 0
    assert line["batching_bound"] > 0
    assert set(line["cpu_busy"]) == {"one_slot", "slots"} and all(v > 0 for v in line["cpu_busy"].values())
    peer = line["llama_server"]  # the same requests to llama-server -np 1 and -np C, prompt cache off
    assert peer["throughput_ratio"] > 0 and peer["flags"] == "--no-cache-prompt"
    assert set(peer["seconds"]) == {"np_1", "np_C"} and peer["answers_identical_count"].endswith("/2")
    assert line["random_weights"] is True
