"""Issue 49, groups 1 and 11: a model source is hostile input: no code from a model folder, no raw exceptions.

Group 1: a folder whose ``config.json`` names custom classes (``auto_map``) made transformers ask
"Do you wish to run the custom code? [y/N]" on stdin, and with ``y`` the folder's Python ran.
Every folder here carries a module that writes a marker file when it is imported: the marker
must never appear, through the loader, the real CLI (stdin answering ``y``) and the server's start.

Group 11: a manifest ``"size": "abc"``, a config blob or manifest config that is not an object,
deep JSON and an absurd ``vocab_size`` each gave a raw ``ValueError`` / ``AttributeError`` /
``RecursionError`` or transformers' mismatch table; each is now one line naming the file, the
field and the reason, raised by the real loader functions on files built here.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from hardening_helpers import run_bounded

from refsight.errors import ModelLoadError

NO_CODE = "refsight never runs a model folder's code"


# ------------------------------------------------------------------ group 1: no code from a model folder


def _evil_module(folder: Path, marker: Path) -> None:
    """A module that, imported, writes ``marker`` (what transformers would import for the auto_map)."""
    code = f"from pathlib import Path\nPath({str(marker)!r}).write_text('the folder ran code')\n"
    for module in ("configuration_evil.py", "modeling_evil.py", "tokenization_evil.py"):
        (folder / module).write_text(code + "class Evil:\n    pass\n")


def _unknown_type_folder(root: Path, marker: Path) -> Path:
    folder = root / "evil-custom"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "evil_custom",
        "auto_map": {"AutoConfig": "configuration_evil.Evil", "AutoModel": "modeling_evil.Evil"},
    }))
    _evil_module(folder, marker)
    return folder


def _known_type_folder(root: Path, marker: Path) -> Path:
    """The tiny Qwen2-VL checkpoint (real weights) whose config adds an auto_map to custom classes."""
    from refsight.builtin_models.checkpoints import ensure_model_dir

    folder = root / "qwen2-vl-custom"
    shutil.copytree(ensure_model_dir("tiny-qwen2-vl"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_evil.Evil", "AutoModelForImageTextToText": "modeling_evil.Evil"}
    (folder / "config.json").write_text(json.dumps(config))
    _evil_module(folder, marker)
    return folder


@pytest.mark.parametrize("kind", ["unknown model_type", "known model_type"])
def test_a_folder_naming_custom_code_is_refused_before_transformers_reads_it(tmp_path, model_cache, consent, kind):
    from refsight.backends.hf import load_hf_backend

    marker = tmp_path / "ran.txt"
    build = _unknown_type_folder if kind == "unknown model_type" else _known_type_folder
    folder = build(tmp_path, marker)
    with pytest.raises(ModelLoadError, match=NO_CODE) as error:
        load_hf_backend(f"hf:{folder}")
    assert "auto_map" in str(error.value) and str(folder) in str(error.value)
    assert "\n" not in str(error.value)
    assert not marker.exists()


@pytest.fixture
def consent(monkeypatch):
    """Every prompt answered "y", as the hostile round's stdin did: nothing may ask, so nothing may run."""
    monkeypatch.setattr("builtins.input", lambda *args: "y")


def test_the_vllm_backend_reads_a_served_config_without_its_code(tmp_path, consent):
    # The served model's config is read with AutoConfig (refsight's own check does not run there):
    # trust_remote_code=False, so transformers refuses the custom class, and the check is skipped.
    from refsight.backends.vllm.loading import _check_same_model

    marker = tmp_path / "ran.txt"
    folder = _unknown_type_folder(tmp_path, marker)
    assert _check_same_model("vllm:test", str(folder), "hf:encoder", encoder=None) is None
    assert not marker.exists()


def test_an_auto_map_transformers_reads_runs_no_code(tmp_path, model_cache, consent):
    # An auto_map refsight does not read itself (the tokenizer's) reaches transformers, which with
    # trust_remote_code=False never imports the class: the model loads on transformers' own classes.
    from refsight.backends.hf import load_hf_backend
    from refsight.builtin_models.checkpoints import ensure_model_dir

    marker = tmp_path / "ran.txt"
    folder = tmp_path / "qwen2-vl-custom-tokenizer"
    shutil.copytree(ensure_model_dir("tiny-qwen2-vl"), folder)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.update(auto_map={"AutoTokenizer": ["tokenization_evil.Evil", None]}, tokenizer_class="EvilTokenizer")
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    _evil_module(folder, marker)
    try:
        load_hf_backend(f"hf:{folder}").close()
    except ModelLoadError as e:  # transformers may refuse the class it will not import: one line then
        assert "\n" not in str(e)
    assert not marker.exists()


def test_the_vllm_server_is_never_started_trusting_remote_code():
    from refsight.backends.vllm.serve import start_server
    from refsight.errors import InvalidInputError

    for flag in ("--trust-remote-code", "--trust_remote_code", "--trust-remote"):
        with pytest.raises(InvalidInputError, match=NO_CODE):
            start_server("tiny-qwen2-vl-vllm", extra_args=[flag], env_dir="/nonexistent")


# ------------------------------------------------------------------ group 11: hf configs, one line each


def _tiny_copy(tmp_path: Path, edit) -> Path:
    from refsight.builtin_models.checkpoints import ensure_model_dir

    folder = tmp_path / "edited"
    shutil.copytree(ensure_model_dir("tiny-qwen2-vl"), folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("edit, needles", [
    (lambda c: c["text_config"].update(vocab_size=10**12), ["text_config.vocab_size", "between 0 and"]),
    (lambda c: c["text_config"].update(vocab_size=10**7), ["text_config", "imply at least", "weight files hold"]),
    (lambda c: c["text_config"].update(vocab_size=1000), ["vocab_size", "does not match the 512 rows"]),
    (lambda c: c["text_config"].update(num_hidden_layers=10**9), ["text_config.num_hidden_layers", "between 0 and"]),
    (lambda c: c["text_config"].update(intermediate_size=10**6), ["imply at least", "weight files hold"]),
    (lambda c: c["vision_config"].update(depth="two"), ["vision_config.depth", "must be an integer, got 'two'"]),
    (lambda c: c.pop("model_type"), ["model_type", "missing"]),
    # Sizes that pass the bounds but not transformers' own comparison: one line, not its load report's table.
    (lambda c: c["text_config"].update(hidden_size=96), ["does not describe the weights", "in the weights, [", "from the config"]),
])
def test_an_hf_config_that_does_not_describe_its_weights_is_one_line(tmp_path, model_cache, capfd, edit, needles):
    from refsight.backends.hf import load_hf_backend

    folder = _tiny_copy(tmp_path, edit)
    with pytest.raises(ModelLoadError) as error:
        load_hf_backend(f"hf:{folder}")
    message = str(error.value)
    assert "\n" not in message and "config.json" in message, message
    for needle in needles:
        assert needle in message, message
    assert "LOAD REPORT" not in capfd.readouterr().err


@pytest.mark.parametrize("text, needle", [
    ("[" * 100_000 + "]" * 100_000, "nested more than 64 levels"),
    ("[1, 2]", "is not a model config (a JSON object) (found a list)"),
    ("{not json", "not valid JSON"),
])
def test_an_hf_config_that_is_not_a_json_object_is_one_line(tmp_path, text, needle):
    from refsight.backends.hf import load_hf_backend

    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ModelLoadError, match="config.json") as error:
        load_hf_backend(f"hf:{tmp_path}")
    assert needle in str(error.value) and "\n" not in str(error.value)


def test_a_deep_tokenizer_config_is_one_line_naming_the_file(tmp_path, model_cache):
    from refsight.backends.hf import load_hf_backend

    folder = _tiny_copy(tmp_path, lambda c: None)
    (folder / "tokenizer_config.json").write_text('{"a": ' + "[" * 50_000 + "]" * 50_000 + "}")
    with pytest.raises(ModelLoadError, match=r"tokenizer_config\.json: JSON nested more than 64"):
        load_hf_backend(f"hf:{folder}")


def test_the_tiny_checkpoints_pass_the_config_checks(model_cache):
    # The bounds are far from any real model's: every built-in checkpoint (real shapes too) passes.
    from refsight.backends.hf.model_source import check_config
    from refsight.builtin_models.checkpoints import ensure_model_dir

    for name in ("tiny-qwen2-vl", "tiny-smolvlm", "tiny-qwen3-vl"):
        assert check_config(name, str(ensure_model_dir(name)))["model_type"]


# ------------------------------------------------------------------ group 11: Ollama stores, one line each


def _blob(root: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _store(root: Path, *, manifest: bytes | None = None, config: bytes = b'{"model_format": "gguf"}', **layer) -> Path:
    """An Ollama store holding ``m:latest`` (a stand-in model blob), its manifest edited or replaced."""
    model_layer = {"mediaType": "application/vnd.ollama.image.model", **_blob(root, b"GGUF stand-in"), **layer}
    text = manifest if manifest is not None else json.dumps({
        "schemaVersion": 2, "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **_blob(root, config)},
        "layers": [model_layer, {"mediaType": "application/vnd.ollama.image.projector", **_blob(root, b"GGUF mmproj")}],
    }).encode()
    path = root / "manifests" / "registry.ollama.ai" / "library" / "m" / "latest"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text)
    return path


@pytest.mark.parametrize("store, needles", [
    (lambda r: _store(r, size="abc"), ["layers[0].size", "must be an integer, got 'abc'"]),
    (lambda r: _store(r, size=True), ["layers[0].size", "must be an integer, got True"]),
    (lambda r: _store(r, mediaType=7), ["layers[0].mediaType", "must be a string"]),
    (lambda r: _store(r, manifest=b'{"layers": [], "config": "x"}'), ["config", "must be an object"]),
    (lambda r: _store(r, manifest=b'{"layers": {}}'), ["layers", "must be a list"]),
    (lambda r: _store(r, manifest=b'["layers"]'), ["not an Ollama manifest (a JSON object) (found a list)"]),
    (lambda r: _store(r, manifest=b"[" * 100_000), ["nested more than 64 levels"]),
    (lambda r: _store(r, manifest=b"\xff\xfe"), ["not valid JSON"]),
])
def test_a_bad_manifest_is_one_line_naming_its_field(tmp_path, store, needles):
    from refsight.backends.llamacpp.ollama_store import find_model

    path = store(tmp_path)
    with pytest.raises(ModelLoadError) as error:
        find_model("m", tmp_path)
    message = str(error.value)
    assert message.startswith(f"ollama:m: {path}") and "\n" not in message, message
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize("config, needle", [
    (b"[1, 2, 3]", "is not an Ollama config blob (a JSON object) (found a list)"),
    (b'"text"', "(found a string)"),
    (b'{"model_family": {"x": 1}}', "model_family: must be a string"),
    (b'{"model_families": 5}', "model_families: must be a list of strings"),
    (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested more than 64 levels"),
])
def test_a_bad_config_blob_is_one_line_naming_the_blob(tmp_path, monkeypatch, config, needle):
    from refsight.backends.llamacpp.ollama_store import load_ollama_backend

    _store(tmp_path, config=config)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path))
    # The real loader: the model's facts (config blob included) are read before llama.cpp is asked.
    with pytest.raises(ModelLoadError) as error:
        load_ollama_backend("ollama:m")
    message = str(error.value)
    blob = f"sha256-{hashlib.sha256(config).hexdigest()}"
    assert blob in message and needle in message and "\n" not in message, message


# ------------------------------------------------------------------ through the real CLI


@pytest.mark.slow  # three fresh interpreters
@pytest.mark.parametrize("command, folder, needle", [
    ("serve", "unknown", NO_CODE),
    ("generate", "known", NO_CODE),
    ("generate", "huge-vocab", "text_config.vocab_size: must be between 0 and"),
])
def test_the_cli_and_server_refuse_in_one_line_without_a_prompt(tmp_path, model_cache, command, folder, needle):
    marker = tmp_path / "ran.txt"
    if folder == "unknown":
        model = _unknown_type_folder(tmp_path, marker)
    elif folder == "known":
        model = _known_type_folder(tmp_path, marker)
    else:
        model = _tiny_copy(tmp_path, lambda c: c["text_config"].update(vocab_size=10**12))
    answer = tmp_path / "answer.txt"
    answer.write_text("y\n" * 8)  # what the old prompt took as consent
    argv = ["--store", str(tmp_path / "store"), command, "--model", f"hf:{model}"]
    argv += ["--port", "0"] if command == "serve" else ["--prompt", "hello"]
    with answer.open() as stdin:
        result = run_bounded(argv, timeout=120, stdin=stdin)
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert needle in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("refsight: error:")]
    assert len(errors) == 1 and str(model) in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    for stream in (result.stdout, result.stderr):
        assert "[y/N]" not in stream and "custom code" not in stream.replace("names custom code", "")
    assert not marker.exists()


def test_transformers_weight_bar_shows_only_on_a_terminal(capfd):
    """The Python API off a terminal (a log, a pipe): no "Loading weights" bar on stderr."""
    from refsight.backends.hf.loading import bars_on_terminal_only
    from transformers.utils import logging as hf_logging
    from transformers.utils.logging import tqdm

    with bars_on_terminal_only():
        assert not hf_logging.is_progress_bar_enabled()
        for _ in tqdm(range(3), desc="Loading weights"):
            pass
    assert hf_logging.is_progress_bar_enabled()  # restored for whoever set it
    assert "Loading weights" not in capfd.readouterr().err
