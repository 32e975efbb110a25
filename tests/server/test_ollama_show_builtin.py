"""``/api/show`` and ``/api/tags`` for a model that is not in Ollama's store (a built-in GGUF served by name), read
with the ``ollama`` library: the details Ollama fills from the model (parameter size, quantization, modified time,
the params a request gets) are filled from refsight's model, and random weights are said in ``model_info``."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from live_server import LiveServer
from runtimes import require_module

from refsight.server import ServerConfig, create_app
from refsight.server.routes.ollama_models import human_number

pytestmark = pytest.mark.slow  # the tiny GGUF, served in-process (llama-cpp-python: an optional runtime)
GGUF = "tiny-qwen2-vl-gguf"


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")
    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf(GGUF)
    server = LiveServer(create_app(ServerConfig(store=tmp_path_factory.mktemp("store"), model=GGUF, keys={}))).start()
    yield server
    server.stop()


def test_show_fills_what_ollama_fills_from_the_model(live):
    ollama = require_module("ollama", "pip install 'refsight[test]'")
    from refsight.builtin_models.gguf import ensure_gguf

    client = ollama.Client(host=live.url)
    shown = client.show(GGUF)
    details = shown.details
    assert details.format == "gguf" and details.family == "qwen2vl"
    assert details.quantization_level == "F32" and details.parameter_size[-1] in "KMB", details
    newest = max(path.stat().st_mtime for path in ensure_gguf(GGUF))  # the model's and projector's files
    assert shown.modified_at == datetime.fromtimestamp(newest, timezone.utc)
    assert shown.modified_at.year > 1970
    lines = dict(line.split(None, 1) for line in shown.parameters.splitlines())
    assert lines["top_k"] == "40" and lines["num_ctx"].isdigit(), shown.parameters  # what a request gets unset
    assert "\nPARAMETER top_k 40\n" in shown.modelfile
    assert shown.modelinfo["refsight.random_weights"] is True
    (listed,) = client.list().models
    assert listed.details.parameter_size == details.parameter_size and listed.modified_at == shown.modified_at


def test_a_transformers_checkpoint_reports_its_count_and_dtype(model_cache):
    from refsight.backends.registry import get_backend
    from refsight.server.model_facts import ModelDetails

    backend = get_backend("tiny-qwen2-vl")
    details = ModelDetails.of(backend)
    assert details.weights == {"parameter_count": sum(p.numel() for p in backend.model.parameters()),
                               "quantization": "F32"}
    assert details.modified is not None and details.modified > 0


@pytest.mark.parametrize("count, shown", [(8_000_000_000, "8B"), (2_208_985_600, "2.2B"), (256_148_736, "256.15M"),
                                          (12_000_000, "12M"), (12_345, "12K"), (999, "999")])
def test_parameter_size_is_written_as_ollama_writes_it(count, shown):
    assert human_number(count) == shown
