"""``ollama:NAME[:TAG]``: models read from an Ollama-layout store (built offline from the tiny built-in GGUF),
served by the llama.cpp backend: the blobs in place, the params layer's defaults honoured, keys from the blob
digests, and one clear line for what llama.cpp cannot load."""

from __future__ import annotations

import json

import pytest
from hardening_helpers import free_port, run_bounded
from live_server import LiveServer
from ollama_helpers import add_model, tiny_store
from runtimes import require_module

from refsight.backends.registry import get_backend
from refsight.errors import InvalidInputError, ModelLoadError
from refsight.server import ServerConfig, create_app

require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")
pytestmark = pytest.mark.slow  # an Ollama store of the tiny model converted to GGUF (llama-cpp-python: an optional runtime)

PARAMS = {"temperature": 0.7, "seed": 7, "top_k": 20, "stop": ["<|im_end|>"], "num_ctx": 1024}
CHAT = {"messages": [{"role": "user", "content": "Name three colours."}], "stream": False, "options": {"num_predict": 12}}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("ollama-models")
    model, mmproj = tiny_store(root, params=PARAMS, system="You describe images.")
    from refsight.backends import registry

    def forget_ollama_backends() -> None:
        # The process-wide backend cache is keyed by name: an `ollama:tiny` another test module loaded
        # from ITS store must not answer for this one.
        with registry._lock:
            for key in [k for k in registry._instances if k[0].startswith("ollama:")]:
                registry._instances.pop(key).close()

    forget_ollama_backends()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OLLAMA_MODELS", str(root))
        yield root, model, mmproj
    forget_ollama_backends()


def _serve(tmp_path, model: str, **options) -> LiveServer:
    from refsight.settings import BackendOptions

    return LiveServer(create_app(ServerConfig(store=tmp_path / model.replace(":", "_").replace("/", "_"), model=model,
                                              keys={}, backend_options=BackendOptions(**options)))).start()


def test_the_blobs_are_served_in_place_with_keys_from_their_digests(store):
    root, model, mmproj = store
    backend = get_backend("ollama:tiny")
    plain = get_backend(f"llamacpp:{model}", mmproj=str(mmproj))
    assert backend.model_path.parent == root / "blobs" and backend.model_path.name.startswith("sha256-")
    hashed = backend.fingerprint().preprocessing
    assert backend.model_path.name == "sha256-" + hashed["gguf_sha256"].removeprefix("sha256:")
    assert backend.mmproj_path.name == "sha256-" + hashed["mmproj_sha256"].removeprefix("sha256:")
    assert backend.fingerprint().revision == plain.fingerprint().revision  # the revision hashes both blobs
    assert backend.context_size == PARAMS["num_ctx"]  # the params layer's num_ctx is the context
    # The params layer over Ollama's own sampler defaults (top-k 40, top-p 0.9): the layer's top_k wins.
    assert backend.sampling_defaults == {"temperature": 0.7, "seed": 7, "top_k": 20, "top_p": 0.9, "stop": ("<|im_end|>",)}


def test_the_params_layer_is_the_default_a_request_overrides(store, tmp_path):
    _, model, mmproj = store
    ours = _serve(tmp_path, "ollama:tiny:latest")
    plain = _serve(tmp_path, f"llamacpp:{model}", mmproj=str(mmproj), n_ctx=1024)
    try:
        with ours.client() as a, plain.client() as b:
            # The params layer, over Ollama's own top_p 0.9 and min_p 0 (a plain GGUF gets llama-server's instead).
            options = {"temperature": 0.7, "seed": 7, "top_k": 20, "top_p": 0.9, "min_p": 0.0, "stop": ["<|im_end|>"],
                       "num_predict": 12}
            system = [{"role": "system", "content": "You describe images."}]
            defaulted = a.post("/api/chat", json={**CHAT, "model": "tiny"}).json()
            explicit = b.post("/api/chat", json={**CHAT, "model": f"llamacpp:{model}",
                                                  "messages": system + CHAT["messages"], "options": options}).json()
            assert defaulted["message"]["content"] == explicit["message"]["content"]
            assert defaulted["prompt_eval_count"] == explicit["prompt_eval_count"]  # the system layer was used
            greedy = {**CHAT, "options": {"num_predict": 12, "temperature": 0}}
            assert a.post("/api/chat", json={**greedy, "model": "tiny:latest"}).json()["message"]["content"] == (
                b.post("/api/chat", json={**greedy, "model": f"llamacpp:{model}", "messages": system + CHAT["messages"]})
                .json()["message"]["content"])
            shown = a.post("/api/show", json={"model": "tiny"}).json()
            assert shown["parameters"].splitlines() == [  # Ollama's "%-30s %#v" lines of the params layer
                "temperature                    0.7", "seed                           7",
                "top_k                          20", 'stop                           "<|im_end|>"',
                "num_ctx                        1024"]
            assert shown["details"]["family"] == "qwen2vl" and shown["system"] == "You describe images."
            assert shown["template"] == "{{ .Prompt }}"  # the template layer, Ollama's Go template
            backend = get_backend("ollama:tiny")
            modelfile = shown["modelfile"].splitlines()
            assert modelfile[0].startswith('# Modelfile generated by "ollama show"') and "# FROM tiny:latest" in modelfile
            assert any("GGUF's own chat template" in line for line in modelfile if line.startswith("#"))
            assert [line for line in modelfile if not line.startswith("#") and line] == [
                f"FROM {backend.model_path}", f"FROM {backend.mmproj_path}", "TEMPLATE {{ .Prompt }}",
                "SYSTEM You describe images.", "PARAMETER temperature 0.7", "PARAMETER seed 7", "PARAMETER top_k 20",
                "PARAMETER stop <|im_end|>", "PARAMETER num_ctx 1024"]
            # num_ctx, as clients send it: accepted, and the reply names the context the answer had (the served one).
            sized = a.post("/api/chat", json={**greedy, "model": "tiny", "options": {"num_predict": 12, "num_ctx": 8192}})
            assert sized.status_code == 200 and sized.json()["refsight"]["num_ctx"] == PARAMS["num_ctx"], sized.text
            (entry,) = a.get("/api/tags").json()["models"]
            assert entry["name"] == "tiny:latest" and len(entry["digest"]) == 64
    finally:
        ours.stop()
        plain.stop()


def test_a_model_without_a_projector_layer_is_one_line_naming_it_and_where_to_get_its_ggufs(store):
    with pytest.raises(ModelLoadError) as caught:
        get_backend("ollama:textonly")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("ollama:textonly:latest:")
    assert "projector layer" in message and "mmproj GGUF" in message and "llamacpp:" in message


def test_missing_models_and_damaged_blobs_are_refused(store):
    root, _, _ = store
    with pytest.raises(ModelLoadError, match="ollama pull nothing:latest"):
        get_backend("ollama:nothing")
    with pytest.raises(InvalidInputError, match="brings its projector layer"):
        get_backend("ollama:tiny", mmproj="x.gguf")
    damaged = root / "damaged.gguf"
    damaged.write_bytes(get_backend("ollama:tiny").model_path.read_bytes() + bytes(32))  # its own blob
    manifest = add_model(root, "damaged", "v1", model=damaged, projector=get_backend("ollama:tiny").mmproj_path)
    digest = json.loads(manifest.read_text())["layers"][0]["digest"]  # the model layer
    blob = root / "blobs" / digest.replace(":", "-")
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x01")  # one byte off: the content is no longer its digest
    with pytest.raises(ModelLoadError, match="damaged"):
        get_backend("ollama:damaged:v1")


def test_a_context_above_the_trained_one_is_refused_at_start_naming_its_source_before_any_allocation(store, tmp_path):
    # Unchecked, llama.cpp sized a KV cache for 1e9 tokens: peak RSS 4.0 GB (under an 8 GB cap) before it failed.
    root, model, mmproj = store
    add_model(root, "huge", "v1", model=model, projector=mmproj, params={"num_ctx": 1_000_000_000, "stop": ["<|im_end|>"]})
    serve = ["--store", str(tmp_path / "store"), "serve", "--port", str(free_port()), "--workers", "1"]
    layer = run_bounded([*serve, "ollama:huge:v1"], timeout=240)
    flag = run_bounded([*serve, "tiny-qwen2-vl-gguf", "-c", "1000000000"], timeout=240)
    for refused in (layer, flag):
        assert refused.returncode == 1, refused.stderr
        (line,) = [line for line in refused.stderr.splitlines() if line.startswith("refsight: error:")]
        assert "1000000000 tokens per sequence is above the 4096 the model was trained for (GGUF qwen2vl.context_length)" in line
        assert refused.max_rss_mb < 1024, refused.max_rss_mb  # no KV cache was ever allocated
    assert "ollama:huge:v1: its params layer (" in layer.stderr and "sets num_ctx 1000000000" in layer.stderr
    assert "-c / --ctx-size" in flag.stderr
