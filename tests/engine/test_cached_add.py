"""Issue 40: a cached ``refsight add`` needs no model.

The encoder's fingerprint is recorded when a model loads (:mod:`refsight.backends.fingerprint_record`)
and read back while the model's files are unchanged, so adding an image whose package is stored
links it without loading the VLM, importing torch or transformers. The recorded fingerprint must be
the one the loaded backend computes, and changed weights must make the next add miss (and encode).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PIL import Image
from runtimes import require_module

from refsight import Engine
from refsight.backends.fingerprint_record import facts_of, recorded
from refsight.backends.options import BackendOptions
from refsight.context import Models
from refsight.settings import Settings

MODEL = "tiny-qwen2-vl"

#: The CLI in a fresh interpreter whose import system refuses torch and transformers (and their children).
_CLI_WITHOUT_TORCH = textwrap.dedent(
    """
    import sys

    class _Absent:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "transformers"):
                raise ModuleNotFoundError(f"blocked: {name}", name=name)
            return None

    sys.meta_path.insert(0, _Absent())
    from refsight.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


def _image(path: Path, colour: tuple[int, int, int] = (200, 40, 90)) -> Path:
    Image.new("RGB", (48, 40), colour).save(path)
    return path


def _add(store: Path, image: Path, model: str, *, code: list[str] | None = None) -> subprocess.CompletedProcess:
    """``refsight add IMAGE --json`` in a new process (nothing loaded; ``code``: the interpreter's ``-c``)."""
    argv = [sys.executable, *(code or ["-m", "refsight.cli"]), "--store", str(store), "--json", "add", str(image),
            "--model", model, "--attributes", "none"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def _added(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _models(model: str) -> Models:
    return Models(Settings(), BackendOptions(), model, share_packages=True)


@pytest.mark.parametrize("model", [MODEL, "tiny-smolvlm", "tiny-qwen2-vl-gguf"])
def test_the_recorded_fingerprint_is_the_loaded_backends(model):
    if model.endswith("-gguf"):
        require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")
    backend = _models(model).backend()  # a load records it
    fresh = _models(model)  # nothing loaded here
    known = fresh.known_facts()
    assert known == facts_of(backend)
    assert known.fingerprint.digest == backend.fingerprint().digest and known.fingerprint == backend.fingerprint()
    assert not fresh.is_loaded()


def test_a_backend_with_no_sources_is_never_recorded():
    """The toy encoder (like a vLLM server) names no files: only a load tells its fingerprint."""
    _models("toy").backend()
    assert _models("toy").known_facts() is None


def test_a_cached_add_links_the_stored_package_without_loading_the_model(tmp_path):
    image = _image(tmp_path / "cat.png")
    with Engine(tmp_path / "store", model=MODEL) as engine:
        first = engine.add(image)
        digest = engine.backend().fingerprint().digest
    with Engine(tmp_path / "store", model=MODEL) as engine:  # a new engine: no backend loaded
        again = engine.add(image, ref_id="cat-again")
        assert not engine.models.is_loaded()
        assert engine.reference("cat-again").packages == {digest: first.package_key}
        stats = engine.stats().to_dict()
    assert not first.cached and again.cached and again.encode_ms == 0
    assert again.package_key == first.package_key and again.bytes == first.bytes and again.model == first.model
    assert stats["hits"] >= 1


def test_a_cached_add_imports_neither_torch_nor_transformers(tmp_path):
    store, image = tmp_path / "store", _image(tmp_path / "cat.png")
    encoded = _added(_add(store, image, MODEL))  # loads the model: records its fingerprint
    result = _add(store, image, MODEL, code=["-c", _CLI_WITHOUT_TORCH])
    cached = _added(result)
    assert not encoded["cached"] and cached["cached"]
    assert cached["package_key"] == encoded["package_key"]
    assert "blocked" not in result.stderr


def test_changed_weights_make_the_next_add_miss(tmp_path):
    """A local checkpoint's weights rewritten: the record is not used, the model loads and encodes anew."""
    from refsight.builtin_models.checkpoints import ensure_model_dir

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(ensure_model_dir(MODEL), checkpoint)
    model, store, image = f"hf:{checkpoint}", tmp_path / "store", _image(tmp_path / "cat.png")
    first = _added(_add(store, image, model))
    hit = _added(_add(store, image, model, code=["-c", _CLI_WITHOUT_TORCH]))  # recorded: no torch needed
    weights = checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4:] = bytes(b ^ 0x5A for b in data[-4:])  # the last weight's bytes, not its header
    weights.write_bytes(bytes(data))
    assert recorded(model, {}) is None
    changed = _added(_add(store, image, model))
    assert not first["cached"] and hit["cached"] and hit["package_key"] == first["package_key"]
    assert not changed["cached"] and changed["package_key"] != first["package_key"]


def test_a_replaced_checkpoint_file_is_not_a_hit_either(tmp_path):
    """Replaced (a new inode, same bytes) or a file added beside the weights: the record is stale, never trusted."""
    from refsight.builtin_models.checkpoints import ensure_model_dir

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(ensure_model_dir(MODEL), checkpoint)
    model = f"hf:{checkpoint}"
    backend = _models(model).backend()
    assert _models(model).known_facts() == facts_of(backend)
    replacement = checkpoint / "config.json.new"
    shutil.copy2(checkpoint / "config.json", replacement)
    replacement.replace(checkpoint / "config.json")
    assert _models(model).known_facts() is None


def test_a_corrupt_stored_package_is_encoded_again_not_linked(tmp_path):
    image = _image(tmp_path / "cat.png")
    with Engine(tmp_path / "store", model=MODEL) as engine:
        first = engine.add(image)
        path = engine.store.local.path_for(first.package_key)
    path.write_bytes(path.read_bytes()[:-1] + b"\x00")
    with Engine(tmp_path / "store", model=MODEL) as engine:
        again = engine.add(image)
        assert engine.verify().to_dict()["corrupt"] == []
        corrupt = engine.stats().to_dict()["corrupt"]
    assert not again.cached and again.package_key == first.package_key and corrupt == 1


def test_imagenet_attributes_need_no_vlm_either(tmp_path):
    """The default ``--attributes imagenet`` reads the image, not the package: a cached add still loads no VLM."""
    with Engine(tmp_path / "store", model=MODEL) as engine:
        first = engine.add(_image(tmp_path / "cat.png"), attributes=("imagenet",))
    other = _image(tmp_path / "dog.png", (10, 120, 30))  # not stored yet: the model loads and encodes it
    with Engine(tmp_path / "store", model=MODEL) as engine:
        again = engine.add(tmp_path / "cat.png", ref_id="cat-again", attributes=("imagenet",))
        assert not engine.models.is_loaded()
        records = engine.attribute_records.stored([(again.image_sha256, None)], ["imagenet"], None)
        fresh = engine.add(other, attributes=("imagenet",))
    assert again.cached and again.package_key == first.package_key and records[0] is not None
    assert not fresh.cached
