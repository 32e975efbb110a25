"""Every BackendOptions field reaches the transformers backends (issue 19).

Properties: bfloat16 and float32 give cached == fresh tokens; each option that changes
features changes the key, field by field, while device and batch size do not; a moved
hub revision is a miss; options of other runtimes and bad settings are refused by name;
batched encoding stays within the measured bound; running out of memory names the
model, dtype and device and stores nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from backend_models import TINY_FAMILIES
from refsight.requests import GenerationRequest
from refsight.errors import BackendError, InvalidInputError, ModelLoadError

REFS = ("chelsea", "coffee")
#: The device the equivalence test runs on: cpu here; benchmarks/gpu_check.sh sets cuda.
DEVICE = os.environ.get("REFSIGHT_TEST_DEVICE", "cpu")
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


# ------------------------------------------------------------------ equivalence


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", TINY_FAMILIES)
def test_cached_equals_fresh_tokens_in_each_dtype(load, photos, tmp_path, monkeypatch, name, dtype):
    from refsight.store import open_store

    if DEVICE == "cpu":
        backend = load(name) if dtype == "float32" else load(name, dtype=dtype)
    else:
        backend = load(name, dtype=dtype, device=DEVICE)
    assert backend.fingerprint().dtype == dtype  # auto on the CPU is float32
    assert backend.device.split(":")[0] == DEVICE.split(":")[0]
    # One image per forward on both paths: batching has its own (measured) bound below.
    monkeypatch.setattr(backend, "batch_size", 1)
    keys = []
    with open_store(tmp_path / "store") as store:
        for package in backend.encode([photos[r] for r in REFS]):
            store.packages.put(package)
            keys.append(package.key)
    with open_store(tmp_path / "store") as store:  # read back from disk, not memory
        cached = [store.packages.get(k) for k in keys]
    assert all(p.tensors["features.0"].dtype == getattr(torch, dtype) for p in cached)
    assert all(p.tensors["features.0"].device.type == "cpu" for p in cached)  # stored on the CPU, moved at use
    assert all(p.metadata["provenance"]["device"] == backend.device for p in cached)
    prompt = [cached[0], "versus", cached[1], "and", photos["rocket"], "same?"]
    fresh = [photos["chelsea"], "versus", photos["coffee"], "and", photos["rocket"], "same?"]
    # Two calls, not two rows of one batch: a row's place in a batch may move its last bits.
    (a,) = backend.generate([GenerationRequest(prompt, max_new_tokens=6)], return_logits=True)
    (b,) = backend.generate([GenerationRequest(fresh, max_new_tokens=6)], return_logits=True)
    assert a.token_ids == b.token_ids
    assert a.logits.device.type == "cpu"
    # Same inputs, same shapes, same kernels: bit-identical (on a GPU too, where
    # forward kernels are deterministic for a fixed shape).
    assert (a.logits - b.logits).abs().max().item() == 0.0


# ------------------------------------------------------------------------ keys


def _key(backend, photos, image="chelsea"):
    return backend.encode([photos[image]])[0].key


@pytest.mark.parametrize(
    "options, field",
    [
        ({"dtype": "bfloat16"}, "dtype"),
        ({"dtype": "float16"}, "dtype"),
        ({"attn": "eager"}, "preprocessing.attn_implementation"),
        ({"min_pixels": 56 * 56}, "preprocessing.size"),
        ({"max_pixels": 56 * 56}, "preprocessing.size"),
        ({"processor_kwargs": {"do_normalize": False}}, "preprocessing.do_normalize"),
        ({"processor_kwargs": {"image_mean": [0.5, 0.5, 0.5]}}, "preprocessing.image_mean"),
        ({"processor_kwargs": {"resample": 2}}, "preprocessing.resample"),
    ],
)
def test_each_feature_option_changes_the_key(load, photos, options, field):
    default, changed = load("tiny-qwen2-vl"), load("tiny-qwen2-vl", **options)
    assert _key(default, photos) != _key(changed, photos)
    a, b = default.fingerprint().to_dict(), changed.fingerprint().to_dict()
    top, _, sub = field.partition(".")
    assert (a[top][sub] != b[top][sub]) if sub else (a[top] != b[top])


def test_fingerprint_names_processor_class_and_attention(load):
    pre = load("tiny-qwen2-vl").fingerprint().preprocessing
    assert pre["processor"] == "Qwen2VLImageProcessorPil"
    assert pre["attn_implementation"]["vision"] == "sdpa"
    assert load("tiny-smolvlm").fingerprint().preprocessing["processor"] == "SmolVLMImageProcessorPil"


def test_device_and_batch_size_are_provenance_not_key(load, photos):
    default = load("tiny-qwen2-vl")
    other = load("tiny-qwen2-vl", device="cpu", batch_size=1)
    a, b = default.encode([photos["coffee"]])[0], other.encode([photos["coffee"]])[0]
    assert a.key == b.key and other.batch_size == 1
    prov = a.metadata["provenance"]
    assert prov["device"] == "cpu" and prov["torch"] == torch.__version__
    assert {"transformers", "date", "refsight"} <= set(prov)
    assert "provenance" not in a.fingerprint.to_json()


def test_smolvlm_max_pixels_maps_to_whole_tiles(load, photos):
    smol = load("tiny-smolvlm", max_pixels=100 * 100)  # tile 32: 3 tiles = 96 ≤ 100
    assert smol.fingerprint().preprocessing["size"] == {"longest_edge": 96}
    package = smol.encode([photos["chelsea"]])[0]
    assert package.key != _key(load("tiny-smolvlm"), photos)
    layout = package.metadata["layout"]
    assert max(layout["rows"][0][0], layout["cols"][0][0]) == 3
    with pytest.raises(InvalidInputError, match="min_pixels"):
        load("tiny-smolvlm", min_pixels=1024)
    with pytest.raises(InvalidInputError, match="max_pixels.*tile"):
        load("tiny-smolvlm", max_pixels=31 * 31)


def test_refusals_name_the_option():
    from refsight.backends.hf import load_hf_backend
    from refsight.backends.builtin import load_tiny
    from refsight.builtin_models.checkpoints import ensure_model_dir

    for option in ("mmproj", "encoder"):
        with pytest.raises(InvalidInputError, match=f"^{option}: .*(llama.cpp|vLLM)"):
            load_tiny("tiny-qwen2-vl", **{option: "x"})
        with pytest.raises(InvalidInputError, match=f"^{option}: "):
            load_hf_backend(f"hf:{ensure_model_dir('tiny-qwen2-vl')}", **{option: "x"})
    with pytest.raises(InvalidInputError, match="processor_kwargs: no_such_setting"):
        load_tiny("tiny-qwen2-vl", processor_kwargs={"no_such_setting": 1})
    with pytest.raises(InvalidInputError, match="processor settings patch_size"):
        load_tiny("tiny-qwen2-vl", processor_kwargs={"patch_size": "wide"})
    with pytest.raises(InvalidInputError, match="processor_kwargs: max_pixels.*set it once"):
        load_tiny("tiny-qwen2-vl", max_pixels=4096, processor_kwargs={"max_pixels": 8192})
    with pytest.raises(InvalidInputError, match="max_pixels=100"):
        load_tiny("tiny-qwen2-vl", max_pixels=100)  # below the checkpoint's min_pixels
    with pytest.raises(InvalidInputError, match="^revision: "):
        load_tiny("tiny-qwen2-vl", revision="main")
    with pytest.raises(InvalidInputError, match="^revision: .*local directory"):
        load_hf_backend(f"hf:{ensure_model_dir('tiny-qwen2-vl')}", revision="main")
    if not torch.cuda.is_available():
        with pytest.raises(InvalidInputError, match="device 'cuda'"):
            load_tiny("tiny-qwen2-vl", device="cuda")
    with pytest.raises(ModelLoadError, match="attn='no-such-kernel'"):
        load_tiny("tiny-qwen2-vl", attn="no-such-kernel")


def test_processor_kwarg_json_text_from_the_cli_is_decoded(load):
    smol = load("tiny-smolvlm", processor_kwargs={"max_image_size": '{"longest_edge": 48}'})
    assert smol.fingerprint().preprocessing["max_image_size"] == {"longest_edge": 48}


# ---------------------------------------------------------------- hub revision


def test_moved_hub_revision_is_a_miss(tmp_path):
    """A fake offline hub cache whose ``main`` moves from commit A to commit B."""
    from refsight.builtin_models.checkpoints import ensure_model_dir

    repo = tmp_path / "hub" / "models--refsight--tiny-qwen2-vl"
    a, b = "a" * 40, "b" * 40
    for commit in (a, b):
        shutil.copytree(ensure_model_dir("tiny-qwen2-vl"), repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    code = textwrap.dedent(
        f"""
        import json
        from pathlib import Path
        from PIL import Image
        from refsight.backends.hf import load_hf_backend
        from refsight.errors import ModelLoadError
        from refsight.inputs.images import load_image

        image = load_image(Image.new("RGB", (64, 48), (10, 200, 30)))
        out = {{}}
        for label, commit in (("a", "{a}"), ("b", "{b}")):
            Path("{repo}/refs/main").write_text(commit)
            backend = load_hf_backend("hf:refsight/tiny-qwen2-vl")
            out[label] = [backend.fingerprint().revision, backend.encode([image])[0].key]
        pinned = load_hf_backend("hf:refsight/tiny-qwen2-vl", revision="aaaaaaa")  # a commit prefix
        out["pinned"] = pinned.fingerprint().revision
        try:
            load_hf_backend("hf:refsight/tiny-qwen2-vl", revision="v9")
        except ModelLoadError as e:
            out["error"] = str(e)
        print(json.dumps(out))
        """
    )
    env = _env(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub"), HF_HOME=str(tmp_path / "hf"))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["a"][0] == a and out["b"][0] == b  # the commit, never "main"
    assert out["a"][1] != out["b"][1]  # main moved: the old packages are a miss
    assert out["pinned"] == a
    assert "cannot resolve revision 'v9'" in out["error"] and "HF_HUB_OFFLINE" in out["error"]


# ------------------------------------------------------------ hash memo


_MEMO_PROBE = """
import json, sys
from refsight.backends.hf import hashing
from refsight.backends.hf.revision import directory_revision
revision = directory_revision(sys.argv[1])
print(json.dumps({"revision": revision, "hits": hashing.memo_hits, "hashed": hashing.files_hashed}))
"""


def _memo_probe(directory: Path, cache: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _MEMO_PROBE, str(directory)],
        env=_env(REFSIGHT_HASH_MEMO_DIR=str(cache)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_weight_hash_memo_serves_a_second_process_and_touching_invalidates(tmp_path):
    from refsight.backends.hf.revision import content_files
    from refsight.builtin_models.checkpoints import ensure_model_dir

    model = tmp_path / "model"
    shutil.copytree(ensure_model_dir("tiny-qwen2-vl"), model)
    files = content_files(model)
    assert {"model.safetensors", "config.json", "preprocessor_config.json"} <= {p.name for p in files}
    first = _memo_probe(model, tmp_path / "cache")
    assert first["hashed"] == len(files) and first["hits"] == 0
    second = _memo_probe(model, tmp_path / "cache")
    assert second == {**first, "hashed": 0, "hits": len(files)}  # nothing read again
    weights = model / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # same bytes, touched
    third = _memo_probe(model, tmp_path / "cache")
    assert third["hashed"] == 1 and third["hits"] == len(files) - 1
    assert third["revision"] == first["revision"]  # the bytes did not change


def test_a_redis_url_in_refsight_redis_never_becomes_the_hash_memo_directory(tmp_path):
    """``$REFSIGHT_REDIS`` is the Redis tier's URL: hashing a checkpoint must not write under ``redis:/...``."""
    from refsight.builtin_models.checkpoints import ensure_model_dir

    model = tmp_path / "model"
    shutil.copytree(ensure_model_dir("tiny-qwen2-vl"), model)
    work = tmp_path / "cwd"
    work.mkdir()
    memo_home = tmp_path / "models"
    env = _env(REFSIGHT_REDIS="redis://127.0.0.1:6379/0", REFSIGHT_MODEL_CACHE=str(memo_home))
    env.pop("REFSIGHT_HASH_MEMO_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-c", _MEMO_PROBE, str(model)], env=env, cwd=work, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["hashed"] > 0
    assert not any(p.name.startswith("redis:") for p in work.rglob("*")), sorted(work.rglob("*"))
    assert (memo_home / "file-hashes.json").is_file()  # the memo lives in the model cache instead


def test_config_and_processor_files_are_part_of_the_local_revision(tmp_path):
    from refsight.backends.hf.revision import directory_revision
    from refsight.builtin_models.checkpoints import ensure_model_dir

    model = tmp_path / "model"
    shutil.copytree(ensure_model_dir("tiny-qwen2-vl"), model)
    before = directory_revision(model)
    for name in ("preprocessor_config.json", "config.json"):
        path = model / name
        data = json.loads(path.read_text())
        data["refsight_test_edit"] = name
        path.write_text(json.dumps(data))
        after = directory_revision(model)
        assert after != before
        before = after
    (model / "tokenizer_config.json").write_text("{}")  # tokenizer files do not change features
    assert directory_revision(model) == before


# ------------------------------------------------------------ batching bound

#: Measured on the tiny models (2 CPU threads, torch 2.13): float32 Qwen features differ
#: between batch 4 and batch 1 by at most 6.4e-8 (6.8e-7 of the largest feature);
#: SmolVLM and every bfloat16 model by exactly 0. The bound asserted is 1e-6 relative.
BATCH_BOUND_RELATIVE = 1e-6


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["tiny-qwen2-vl", "tiny-qwen3-vl", "tiny-smolvlm"])
def test_batched_encode_within_measured_bound(load, photos, name, dtype):
    backend = load(name) if dtype == "float32" else load(name, dtype=dtype)
    images = [photos[n] for n in ("chelsea", "coffee", "astronaut", "rocket")]
    size = backend.batch_size
    try:
        backend.batch_size = 4
        batched = backend.encode(images)
        backend.batch_size = 1
        single = backend.encode(images)
    finally:
        backend.batch_size = size
    worst = scale = 0.0
    for a, b in zip(batched, single):
        assert a.key == b.key and a.metadata["num_tokens"] == b.metadata["num_tokens"]
        for k in a.tensors:
            worst = max(worst, (a.tensors[k].double() - b.tensors[k].double()).abs().max().item())
            scale = max(scale, b.tensors[k].double().abs().max().item())
    assert worst <= BATCH_BOUND_RELATIVE * scale
    if dtype == "bfloat16" or "smolvlm" in name:
        assert worst == 0.0


# ------------------------------------------------------------ out of memory

_OOM_PROBE = """
import json, resource, sys
import numpy as np
from PIL import Image
from refsight.backends.hf import load_hf_backend
from refsight.backends.builtin import load_tiny
from refsight.builtin_models.checkpoints import ensure_model_dir
from refsight.errors import BackendError, ModelLoadError
from refsight.inputs.images import load_image
from refsight.store import open_store

def headroom(extra):
    vm = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + extra, resource.RLIM_INFINITY))

out = {}
# Eager attention materialises [heads, n, n] for ~5300 patches (~215 MB): more than allowed.
backend = load_tiny("tiny-qwen2-vl", max_pixels=1024 * 1024, attn="eager")
big = load_image(Image.fromarray((np.random.default_rng(0).random((1024, 1024, 3)) * 255).astype("uint8")))
smol_dir = ensure_model_dir("tiny-smolvlm")
with open_store(sys.argv[1]) as store:
    backend.encode([load_image(Image.new("RGB", (64, 64)))])  # lazy imports happen before the limit
    headroom(64 * 2**20)
    try:
        for package in backend.encode([big]):
            store.packages.put(package)
    except BackendError as e:
        out["encode"] = [type(e).__name__, str(e)]
    out["stored"] = len(list(store.packages.keys()))
    headroom(2**20)
    try:
        load_hf_backend("tiny-smolvlm", source=str(smol_dir))
    except ModelLoadError as e:
        out["load"] = [type(e).__name__, str(e)]
print(json.dumps(out))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux")
def test_out_of_memory_names_model_dtype_device_and_stores_nothing(tmp_path, load):
    load("tiny-qwen2-vl")  # built in the session cache before the child runs
    load("tiny-smolvlm")
    proc = subprocess.run(
        [sys.executable, "-c", _OOM_PROBE, str(tmp_path / "store")], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    kind, message = out["encode"]
    assert kind == "BackendError" and message.startswith("tiny-qwen2-vl: encode failed: out of memory")
    assert "dtype float32 on device cpu" in message and "--max-pixels" in message
    assert out["stored"] == 0
    kind, message = out["load"]
    assert kind == "ModelLoadError" and message.startswith("tiny-smolvlm: ") and "out of memory" in message


def test_real_torch_allocation_failure_is_named(load):
    from refsight.backends.hf.runtime import runtime_errors

    with pytest.raises(BackendError, match=r"^m: encode failed: out of memory \(dtype bfloat16 on device cpu\)"):
        with runtime_errors("m", BackendError, "encode failed", device="cpu", dtype="bfloat16"):
            torch.empty(1 << 62, dtype=torch.uint8)
