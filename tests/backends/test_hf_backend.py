"""Behaviour of the transformers backends beyond equivalence: no vision work for cached
references, keys that follow every setting, labels, validation and clear load errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from runtimes import require_runtime

from backend_models import ALL_FAMILIES, TOWER_CALLS, vision_tower
from refsight.requests import GenerationRequest
from refsight.errors import CorruptPackageError, InvalidInputError, ModelLoadError
from refsight.package import VisualPackage


def _vision_tower(backend):
    return vision_tower(backend)


@pytest.fixture
def counters(monkeypatch):
    """Attach call counters to a backend's vision tower and image processor."""
    hooks = []

    def attach(backend):
        counts = {"vision": 0, "preprocess": 0}
        hooks.append(_vision_tower(backend).register_forward_hook(lambda *a: counts.__setitem__("vision", counts["vision"] + 1)))
        original = backend.lay_out  # every image the processor lays out comes through here

        def counted(images):
            counts["preprocess"] += len(images)
            return original(images)

        monkeypatch.setattr(backend, "lay_out", counted)
        return counts

    yield attach
    for hook in hooks:
        hook.remove()


@pytest.mark.parametrize("name", ALL_FAMILIES)
def test_cached_reference_runs_no_vision_encoder_and_no_image_processor(load, photos, counters, name):
    backend = load(name)
    refs = backend.encode([photos["chelsea"], photos["coffee"]])
    counts = counters(backend)
    out = backend.generate([GenerationRequest([refs[0], "vs", refs[1], "same?"], max_new_tokens=3)])
    assert counts == {"vision": 0, "preprocess": 0}
    assert out[0].random_weights is True and out[0].timings_ms["encode"] == 0.0
    # A fresh candidate next to them is encoded once (and only it).
    backend.generate([GenerationRequest([refs[0], refs[1], photos["rocket"], "same?"], max_new_tokens=3)])
    assert counts == {"vision": TOWER_CALLS.get(name, 1), "preprocess": 1}


def test_encode_batches_by_batch_size_and_keeps_order(load, photos, counters):
    backend = load("tiny-qwen2-vl")
    images = [photos[n] for n in ("chelsea", "coffee", "astronaut", "rocket", "chelsea")]
    counts = counters(backend)
    packages = backend.encode(images)
    assert counts["vision"] == -(-len(images) // backend.batch_size)  # one tower call per batch
    assert [p.image_sha256 for p in packages] == [i.sha256 for i in images]
    # Batching changes features by float rounding at most: CPU GEMM kernels block their
    # work by the row count (all patches of the batch), so the last bits may differ.
    alone = backend.encode([photos["rocket"]])[0]
    assert (alone.tensors["features.0"] - packages[3].tensors["features.0"]).abs().max().item() <= 1e-6
    assert alone.metadata["layout"] == packages[3].metadata["layout"]
    assert alone.metadata["placeholder"] == packages[3].metadata["placeholder"]
    assert alone.key == packages[3].key and alone.encode_ms > 0


def test_qwen3_package_holds_deepstack_features(load, photos):
    backend = load("tiny-qwen3-vl")
    package = backend.encode([photos["astronaut"]])[0]
    layers = len(backend.model.config.vision_config.deepstack_visual_indexes)
    assert {f"deepstack_features.{i}.0" for i in range(layers)} | {"features.0"} == set(package.tensors)
    assert package.tensors["deepstack_features.0.0"].shape == package.tensors["features.0"].shape
    grid = package.metadata["layout"]["image_grid_thw"]
    assert package.metadata["num_tokens"] == grid[0][1] * grid[0][2] // 4 == package.tensors["features.0"].shape[0]


def test_smolvlm_package_holds_every_tile(load, photos):
    backend = load("tiny-smolvlm")
    package = backend.encode([photos["chelsea"]])[0]
    layout = package.metadata["layout"]
    tiles = layout["rows"][0][0] * layout["cols"][0][0] + 1
    assert tiles > 1
    rows = tiles * backend.processor.image_seq_len
    assert list(package.tensors["features.0"].shape) == [rows, 64]
    assert package.metadata["num_tokens"] == rows == package.metadata["placeholder"].count("<image>")


def test_key_changes_with_max_pixels(load, photos):
    default = load("tiny-qwen2-vl")
    smaller = load("tiny-qwen2-vl", max_pixels=56 * 56)
    assert default.fingerprint().preprocessing["size"]["longest_edge"] == 112 * 112
    assert smaller.fingerprint().preprocessing["size"]["longest_edge"] == 56 * 56
    a, b = default.encode([photos["chelsea"]])[0], smaller.encode([photos["chelsea"]])[0]
    assert a.key != b.key
    assert a.metadata["num_tokens"] > b.metadata["num_tokens"]
    with pytest.raises(CorruptPackageError, match="preprocessing.size"):
        default.validate_package(b)


def test_key_changes_with_smolvlm_tile_size(load, photos):
    default = load("tiny-smolvlm")
    wider = load("tiny-smolvlm", tile_size=48)
    a, b = default.encode([photos["coffee"]])[0], wider.encode([photos["coffee"]])[0]
    assert a.key != b.key
    # A tile of 48 px is (48 / 8)² patches, pixel-shuffled by 2²: 9 feature rows, 9 <image> tokens a tile.
    assert (default.processor.image_seq_len, wider.processor.image_seq_len) == (4, 9)
    assert b.metadata["placeholder"].count("<image>") == b.metadata["feature_rows"]
    # A package made at another tile size is refused, not silently misplaced.
    with pytest.raises(CorruptPackageError, match="max_image_size"):
        default.validate_package(b)


def test_key_follows_weight_content_not_path(load, photos, tmp_path):
    from refsight.backends.hf import load_hf_backend
    from refsight.builtin_models.checkpoints import ensure_model_dir

    source = ensure_model_dir("tiny-qwen2-vl")
    same, changed = tmp_path / "same", tmp_path / "changed"
    shutil.copytree(source, same)
    shutil.copytree(source, changed)
    from safetensors.torch import load_file, save_file

    weights = load_file(changed / "model.safetensors")
    first = sorted(weights)[0]
    weights[first] = weights[first] + 1e-3
    save_file(weights, changed / "model.safetensors", metadata={"format": "pt"})

    original = load("tiny-qwen2-vl").encode([photos["rocket"]])[0]
    copy = load_hf_backend(f"hf:{same}").encode([photos["rocket"]])[0]
    other = load_hf_backend(f"hf:{changed}")
    assert copy.key == original.key  # same weights elsewhere: same revision, a cache hit
    assert other.fingerprint().revision != original.fingerprint.revision
    assert other.encode([photos["rocket"]])[0].key != original.key
    assert other.random_weights is True  # the marker travels with the directory


def test_fingerprint_names_model_revision_dtype_and_settings(load):
    fp = load("tiny-qwen2.5-vl").fingerprint()
    assert fp.backend == "hf-qwen2_5_vl" and fp.model_id == "refsight/tiny-qwen2.5-vl"
    assert fp.revision.startswith("sha256:") and fp.dtype == "float32"
    pre = fp.preprocessing
    for key in ("size", "patch_size", "merge_size", "temporal_patch_size", "image_mean", "image_std", "resample"):
        assert key in pre
    # The vision config (window size ...) is in the revision, which hashes config.json with the weights.
    assert pre["model"]["processor"] == {} and pre["model"]["layout"] == {}


def test_batch_of_requests_is_labelled_and_ordered(load, photos):
    backend = load("tiny-smolvlm")
    ref = backend.encode([photos["chelsea"]])[0]
    requests = [
        GenerationRequest(["Describe", ref], max_new_tokens=2),
        GenerationRequest([ref, "and", photos["rocket"], "compare them"], max_new_tokens=4),
    ]
    both = backend.generate(requests, return_logits=True)
    alone = backend.generate([requests[1]], return_logits=True)[0]
    assert [len(g.token_ids) <= r.max_new_tokens for g, r in zip(both, requests)] == [True, True]
    assert all(g.random_weights and g.model == "tiny-smolvlm" for g in both)
    assert both[1].logits.shape[0] == len(both[1].token_ids)
    # Left padding keeps a row's greedy answer whatever it is batched with.
    assert both[1].token_ids == alone.token_ids


def test_text_with_special_tokens_is_refused(load, photos):
    backend = load("tiny-qwen2-vl")
    with pytest.raises(InvalidInputError, match="image_pad"):
        backend.generate([GenerationRequest(["look <|image_pad|> here"])])
    with pytest.raises(InvalidInputError, match="segments"):
        backend.generate([GenerationRequest(["text", 42])])
    with pytest.raises(InvalidInputError, match="max_new_tokens"):
        backend.generate([GenerationRequest(["text"], max_new_tokens=0)])


def test_package_whose_shapes_disagree_is_refused(load, photos):
    backend = load("tiny-qwen2-vl")
    good = backend.encode([photos["coffee"]])[0]
    cut = VisualPackage(
        tensors={"features.0": good.tensors["features.0"][:-1]},
        metadata=dict(good.metadata),
        image_sha256=good.image_sha256,
        fingerprint=good.fingerprint,
    )
    with pytest.raises(CorruptPackageError, match="features hold .* rows, metadata says"):
        backend.generate([GenerationRequest([cut, "same?"])])
    foreign = load("tiny-qwen2.5-vl").encode([photos["coffee"]])[0]
    with pytest.raises(CorruptPackageError, match="another encoder"):
        backend.validate_package(foreign)


def test_json_schema_constrains_its_row_only(load, photos):
    backend = load("tiny-qwen2-vl")
    if not backend.supports_constrained_decoding:
        require_runtime("constrained decoding (xgrammar)", "the HF backend reports supports_constrained_decoding=False")
    ref = backend.encode([photos["chelsea"]])[0]
    schema = {"type": "boolean"}
    out = backend.generate(
        [GenerationRequest([ref, "same?"], max_new_tokens=6, json_schema=schema), GenerationRequest([ref, "free"], max_new_tokens=3)]
    )
    assert json.loads(out[0].text) in (True, False)


# --------------------------------------------------------------------- loading


def test_missing_directory_is_a_clear_load_error(tmp_path):
    from refsight.backends.hf import load_hf_backend

    with pytest.raises(ModelLoadError, match="no such model directory"):
        load_hf_backend(f"hf:{tmp_path / 'nope'}")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_hf_backend(f"hf:{tmp_path}")


def test_unknown_and_unsupported_model_types_are_clear_load_errors(tmp_path):
    from refsight.backends.hf import load_hf_backend

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(ModelLoadError, match="unsupported architecture"):
        load_hf_backend(f"hf:{tmp_path}")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ModelLoadError, match="unsupported architecture 'gpt2'.*qwen2_vl"):
        load_hf_backend(f"hf:{tmp_path}")
    # One line: why this model type cannot be served, and the proven ones.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mllama"}))
    with pytest.raises(ModelLoadError, match="unsupported architecture 'mllama'.*lacks the precomputed-features seam.*gemma3") as error:
        load_hf_backend(f"hf:{tmp_path}")
    assert "\n" not in str(error.value)


def test_a_torchvision_only_family_without_torchvision_names_the_package_to_install(tmp_path):
    # Where torchvision cannot import (a fresh process that blocks it: the test extras install it), a family
    # whose only image processor needs it is not "unsupported": the error names the package to install.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "lfm2_vl"}))
    code = (
        "import sys\n"
        "sys.modules['torchvision'] = None\n"
        "from refsight.backends.hf import load_hf_backend\n"
        "from refsight.errors import ModelLoadError\n"
        "try:\n"
        f"    load_hf_backend('hf:{tmp_path}')\n"
        "except ModelLoadError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"'lfm2_vl': .*needs torchvision.*pip install torchvision==0\.\d+\.\*", done.stdout), done.stdout
    assert "unsupported architecture" not in done.stdout


def test_missing_weights_are_a_clear_load_error(tmp_path):
    from refsight.backends.hf import load_hf_backend
    from refsight.builtin_models.checkpoints import ensure_model_dir

    broken = tmp_path / "broken"
    shutil.copytree(ensure_model_dir("tiny-smolvlm"), broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="cannot load"):
        load_hf_backend(f"hf:{broken}")


@pytest.mark.slow  # a fresh interpreter
def test_hub_id_offline_is_a_clear_load_error(tmp_path):
    # A new process: huggingface_hub reads HF_HUB_OFFLINE when it is imported.
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    code = (
        "from refsight.backends.registry import get_backend\n"
        "from refsight.errors import ModelLoadError\n"
        "try:\n"
        "    get_backend('hf:HuggingFaceTB/SmolVLM-256M-Instruct')\n"
        "except ModelLoadError as e:\n"
        "    print('ERR', e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ERR hf:HuggingFaceTB/SmolVLM-256M-Instruct" in proc.stdout
    assert "HF_HUB_OFFLINE" in proc.stdout


def test_unknown_load_option_is_refused():
    from refsight.backends.builtin import load_tiny

    with pytest.raises(InvalidInputError, match="tile_size"):
        load_tiny("tiny-qwen2-vl", tile_size=32)
    with pytest.raises(InvalidInputError, match="max_pixels"):
        load_tiny("tiny-qwen2-vl", max_pixels=-1)


@pytest.mark.parametrize("name", ["tiny-qwen2-vl", "tiny-smolvlm"])
def test_template_text_writes_each_marker_where_the_template_puts_an_image(load, photos, name):
    # /apply-template then /completion must be the chat prompt: the marker stands where the image token
    # stood (Qwen: between <|vision_start|> and <|vision_end|>; SmolVLM: "User:" with no space before it).
    backend = load(name)
    marker = backend.media_marker
    ref = backend.encode([photos["chelsea"]])[0]
    for texts, segments in (([f"A{marker}B"], ["A", ref, "B"]), ([f"{marker}B"], [ref, "B"])):
        text = backend.template_text(texts)
        assert text.count(marker) == 1
        assert text.replace(marker, backend.image_placeholder(ref)) == backend.build_prompt(segments)
    # Without the opening of the answer's turn: the same text, cut where the assistant's turn begins.
    opened, closed = (backend.template_text([f"A{marker}B"], generation_prompt=g) for g in (True, False))
    assert opened.startswith(closed) and len(closed) < len(opened)


def test_a_qwen_package_whose_grid_does_not_fit_its_features_is_refused(load, photos):
    # The grid goes to vLLM beside the embeddings: refsight checks it against the rows before anything is sent.
    import dataclasses

    backend = load("tiny-qwen2-vl")
    package = backend.encode([photos["coffee"]])[0]
    (t, h, w), = package.metadata["layout"]["image_grid_thw"]
    for grid in ([[t, h + 2, w]], [[t, h]], "4x6"):
        bad = dataclasses.replace(package, metadata={**package.metadata, "layout": {"image_grid_thw": grid}})
        with pytest.raises(CorruptPackageError, match="image_grid_thw"):
            backend.validate_package(bad)


@pytest.mark.parametrize("name", ["tiny-qwen2-vl", "tiny-smolvlm"])
def test_packages_are_format_2_so_format_1_keys_never_meet_them(load, photos, name):
    # Qwen and SmolVLM packages changed layout when they moved onto the generic backend: the format is in
    # the key, so a package of the old layout is another key (re-encoded from the kept image), never misread.
    import dataclasses

    from refsight.backends.hf.fingerprint import HF_PACKAGE_FORMAT
    from refsight.package import package_key

    fingerprint = load(name).fingerprint()
    assert fingerprint.format_version == HF_PACKAGE_FORMAT == 2
    format_1 = dataclasses.replace(fingerprint, format_version=1)
    sha = photos["coffee"].sha256
    assert package_key(sha, format_1) != package_key(sha, fingerprint)
