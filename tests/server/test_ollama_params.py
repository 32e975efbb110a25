"""An Ollama model's params layer, checked when the model is loaded (stores built in tmp_path, placeholder
model blobs: nothing here reaches llama.cpp): a value no request could use refuses the model at start,
naming the layer's blob and the parameter, instead of a 400 blaming every client; real models' stop lists
(more than a request's 4) are the defaults; a request still sends at most 4; and ``/api/show``'s text
fields are written as Ollama writes them."""

from __future__ import annotations

import json

import pytest
from ollama_helpers import PARAMS, add_model

from refsight.backends.llamacpp.ollama_store import context_param, find_model, sampling_defaults
from refsight.backends.registry import get_backend
from refsight.sampling import MAX_DEFAULT_STOP_STRINGS, MAX_STOP_STRINGS, Sampling
from refsight.errors import InvalidInputError, ModelLoadError
from refsight.server.routes.ollama_models import _go_float, _modelfile_quote, _parameters

#: A real multi-stop list (the shape of Qwen's and Gemma's Modelfiles, longer than a request's 4).
REAL_STOPS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<start_of_turn>", "</s>", "[INST]",
              "[/INST]", "<|eot_id|>", "<|start_header_id|>"]


def _model(tmp_path, params=None, *, raw: bytes | None = None):
    """``m:latest`` in a store at ``tmp_path`` with the given params layer (placeholder GGUF blobs)."""
    blob = tmp_path / "placeholder.gguf"
    blob.write_bytes(b"GGUF placeholder")
    manifest = add_model(tmp_path, "m", "latest", model=blob, projector=blob, params=params)
    if raw is not None:  # a layer that is not JSON at all: rewrite the params blob and its digest
        from ollama_helpers import _blob

        data = json.loads(manifest.read_text())
        data["layers"] = [layer for layer in data["layers"] if layer["mediaType"] != PARAMS]
        data["layers"].append({"mediaType": PARAMS, **_blob(tmp_path, raw)})
        manifest.write_text(json.dumps(data))
    return find_model("m", tmp_path)


def _refused(model) -> str:
    with pytest.raises(ModelLoadError) as caught:
        sampling_defaults(model, model.params())
        context_param(model, model.params())
    message = str(caught.value)
    assert message.startswith("ollama:m:latest: its params layer (") and "blobs/sha256-" in message, message
    assert "\n" not in message
    return message


def test_real_params_layers_are_the_defaults_stop_lists_longer_than_a_requests_included(tmp_path):
    params = {"stop": REAL_STOPS, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "repeat_penalty": 1.05, "seed": -1,
              "min_p": 0, "num_ctx": 8192, "num_predict": -1, "num_keep": 24, "penalize_newline": False}
    model = _model(tmp_path, params)
    defaults = sampling_defaults(model, model.params())
    assert defaults == {"stop": tuple(REAL_STOPS), "temperature": 0.7, "top_k": 20, "top_p": 0.8,
                        "repetition_penalty": 1.05, "seed": -1, "min_p": 0}
    assert context_param(model, model.params()) == 8192
    assert len(REAL_STOPS) > MAX_STOP_STRINGS
    # A request that sets nothing gets the model's ten stops; one that sets its own may send 4, no more.
    assert Sampling.merged({}, defaults).stop == tuple(REAL_STOPS)
    assert Sampling.merged({"stop": ["a", "b"]}, defaults).stop == ("a", "b")
    with pytest.raises(InvalidInputError, match=f"at most {MAX_STOP_STRINGS}"):
        Sampling.merged({"stop": list("abcde")}, defaults)
    assert sampling_defaults(model, {"stop": "<|im_end|>"}) == {"stop": ("<|im_end|>",)}  # one string, as a line


@pytest.mark.parametrize(("params", "named"), [
    ({"temperature": "hot"}, "sets temperature 'hot': must be a number"),
    ({"temperature": float("nan")}, "sets temperature nan"),
    ({"top_p": float("inf")}, "sets top_p inf"),
    ({"repeat_penalty": 0}, "sets repeat_penalty 0"),
    ({"seed": 1.5}, "sets seed 1.5"),
    ({"top_k": True}, "sets top_k True"),
    ({"stop": ["x"] * (MAX_DEFAULT_STOP_STRINGS + 1)}, f"give 1 to {MAX_DEFAULT_STOP_STRINGS} non-empty strings"),
    ({"stop": ["x" * 257]}, "of at most 256 characters"),
    ({"stop": [""]}, "sets stop to ['']"),
    ({"stop": 5}, "sets stop to 5"),
    ({"stop": ["ok", "\ud800"]}, "stop[1]"),
    ({"num_ctx": "big"}, "sets num_ctx 'big': must be a positive integer"),
    ({"num_ctx": 0}, "sets num_ctx 0"),
    ({"num_ctx": 4096.5}, "sets num_ctx 4096.5"),
])
def test_a_bad_value_refuses_the_model_naming_the_layer_and_the_parameter(tmp_path, params, named):
    assert named in _refused(_model(tmp_path, params))


def test_a_params_layer_that_is_not_a_json_object_names_its_blob(tmp_path):
    assert "is not JSON" in _refused(_model(tmp_path, raw=b"stop <|im_end|>"))
    assert "is not a JSON object" in _refused(_model(tmp_path, raw=b"[1, 2]"))
    assert "is not JSON" in _refused(_model(tmp_path, raw=b"[" * 100_000))  # deep nesting: one line, no traceback


def test_the_model_is_refused_at_load_before_any_runtime_work(tmp_path, monkeypatch):
    _model(tmp_path, {"temperature": "hot", "stop": REAL_STOPS})
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path))
    with pytest.raises(ModelLoadError, match=r"its params layer \(.*sha256-[0-9a-f]{64}\) sets temperature 'hot'"):
        get_backend("ollama:m")  # the placeholder blobs are never opened: the layer is checked first


def test_show_text_fields_are_written_as_ollama_writes_them():
    # Ollama's GetModelInfo: fmt.Sprintf("%-*s %#v", 30, k, v) over the JSON-decoded layer (numbers float64).
    text = _parameters({"stop": ["<|im_start|>", 'say "hi"\n'], "temperature": 0.7, "num_ctx": 1048576, "num_keep": 24,
                        "penalize_newline": False})
    assert text.splitlines() == [
        'stop                           "<|im_start|>"', 'stop                           "say \\"hi\\"\\n"',
        "temperature                    0.7", "num_ctx                        1.048576e+06",
        "num_keep                       24", "penalize_newline               false",
    ]
    assert [_go_float(v) for v in (4096.0, 1e6, 1e-5, 0.0001, 131072.0, -1.0)] == [
        "4096", "1e+06", "1e-05", "0.0001", "131072", "-1"]
    # The Modelfile writer quotes only text with a newline or edge spaces (""" when it holds a quote).
    assert _modelfile_quote("{{ .Prompt }}") == "{{ .Prompt }}"
    assert _modelfile_quote("a\nb") == '"a\nb"' and _modelfile_quote('say "x"\n') == '"""say "x"\n"""'
