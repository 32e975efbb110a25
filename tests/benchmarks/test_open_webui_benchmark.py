"""open_webui.py's part that needs no Open WebUI (CI installs none: its venv is 7.4 GiB): ``--replay`` sends the
captured Open WebUI bodies, one of each kind, to a real ``refsight serve`` and prints its ONE JSON line.
The live run (Open WebUI started, its page driven in Chromium) runs before a release: docs/benchmarks.md."""

from __future__ import annotations

from benchmark_runner import assert_keys, run_benchmark
from runtimes import require_module

FIGURES = ("mode", "open_webui", "model", "checks", "passed", "failed", "refsight_requests", "refsight_refused",
           "seconds")
#: One captured request of each kind, the cheap ones (a task's title asks for 1000 tokens).
NAMES = [f"{connection}.{name}" for connection in ("ollama", "openai")
         for name in ("chat.text", "params.seed=0", "tasks.tags")] + [
    "ollama.models.GET /api/tags", "openai.models.GET /v1/models"]


def test_open_webui_replay_at_a_tiny_size(model_cache):
    require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")
    figures = run_benchmark("open_webui.py", "--replay", "--n-predict", "8", "--replay-names", *NAMES)
    assert_keys(figures, *FIGURES)
    assert figures["mode"] == "replay" and sorted(figures["checks"]) == sorted(f"replay.{name}" for name in NAMES)
    assert figures["refsight_requests"] == len(NAMES) and figures["passed"] + figures["failed"] == len(NAMES)
    for name in ("ollama.models.GET /api/tags", "openai.models.GET /v1/models", "ollama.params.seed=0"):
        assert figures["checks"][f"replay.{name}"] == "passed"
    assert all(outcome == "passed" or outcome.startswith("failed: refsight answered ") for outcome in figures["checks"].values())
