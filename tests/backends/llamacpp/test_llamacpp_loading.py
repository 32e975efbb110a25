"""Loading a llama.cpp model: options, bad files, and what the keys depend on."""

from __future__ import annotations

import logging
import shutil
from types import SimpleNamespace

import pytest
from llama_models import require_llama_cpp

from refsight.errors import InvalidInputError, ModelLoadError

require_llama_cpp()
pytestmark = pytest.mark.slow  # converts the tiny models to GGUF (llama-cpp-python: an optional runtime)

QWEN = "tiny-qwen2-vl-gguf"
SMOL = "tiny-smolvlm-gguf"


def _load(model, **options):
    from refsight.backends.llamacpp import load_llamacpp_backend

    return load_llamacpp_backend(f"llamacpp:{model}", **options)


def _tweaked_copy(path, directory, name):
    """A copy of a GGUF with its last byte (inside the last tensor's data) changed: loads, hashes differently."""
    copy = directory / name
    shutil.copyfile(path, copy)
    data = bytearray(copy.read_bytes())
    data[-1] ^= 0x01  # the low bits of a float32 weight: still a finite, valid model
    copy.write_bytes(bytes(data))
    return copy


def test_prefix_loads_through_the_registry_with_mmproj(gguf_files):
    from refsight.backends.registry import get_backend

    model, mmproj = gguf_files(QWEN)
    backend = get_backend(f"llamacpp:{model}", mmproj=str(mmproj))
    assert backend.fingerprint().backend == "llamacpp-qwen2vl"
    assert backend.supports_constrained_decoding
    assert backend.random_weights is True  # refsight's marker file beside the GGUF says so
    assert backend.fingerprint().model_id == "refsight/tiny-qwen2-vl-gguf"


def test_a_builtin_given_by_path_is_random_and_keyed_as_by_name_wherever_its_copy_lies(gguf, gguf_files, tmp_path):
    # The weights, not the spelling: a copy of a built-in's GGUF under another folder and name (no marker file
    # beside it) is the built-in, with random weights, and its packages have the key the name gives them.
    model, mmproj = gguf_files(QWEN)
    copy = shutil.copyfile(model, tmp_path / "downloaded.gguf")
    backend = _load(copy, mmproj=str(mmproj))
    assert backend.random_weights is True
    assert backend.fingerprint().model_id == "refsight/tiny-qwen2-vl-gguf"
    assert backend.fingerprint().digest == gguf(QWEN).fingerprint().digest


def test_a_users_gguf_is_not_marked_random(gguf_files, tmp_path):
    model, mmproj = gguf_files(QWEN)
    own = _tweaked_copy(model, tmp_path, "model.gguf")  # a built-in's size, other bytes: not a built-in
    backend = _load(own, mmproj=str(mmproj))
    assert backend.random_weights is False
    assert backend.fingerprint().model_id != "refsight/tiny-qwen2-vl-gguf"


def test_backend_names_never_share_keys_with_hf(gguf):
    for name in (QWEN, SMOL):
        assert gguf(name).fingerprint().backend.startswith("llamacpp-")


def test_a_context_above_the_trained_one_is_refused_or_capped_as_llama_server_caps_it(gguf_files, caplog):
    model, mmproj = gguf_files(QWEN)  # trained for 4096 positions
    with pytest.raises(InvalidInputError, match="8192 tokens per sequence is above the 4096 the model was trained for"):
        _load(model, mmproj=str(mmproj), n_ctx=8192)
    with caplog.at_level(logging.WARNING, logger="refsight.backends.llamacpp"):
        backend = _load(model, mmproj=str(mmproj), n_ctx=8192, n_ctx_over_trained="cap")  # refsight serve -c 8192
    assert backend.runtime.settings.n_ctx == 4096
    assert "the slot context (8192) exceeds the training context of the model (4096) - capping" in caplog.text


def test_without_jinja_chats_render_in_the_builtin_format_detected_from_the_template(gguf, gguf_files):
    from refsight.backends.chat_templates import BUILTIN_TEMPLATES

    model, mmproj = gguf_files(QWEN)  # its template is ChatML's Jinja: llama.cpp detects chatml
    plain = gguf(f"llamacpp:{model}", mmproj=str(mmproj), jinja=False)
    assert plain.chat_template_source() == BUILTIN_TEMPLATES["chatml"]
    # no tools without Jinja, as llama-server ("tools param requires --jinja flag"); with it, the template's
    assert not plain.supports_tools and gguf(f"llamacpp:{model}", mmproj=str(mmproj)).supports_tools
    named = gguf(f"llamacpp:{model}", mmproj=str(mmproj), jinja=False, chat_template="gemma")  # --chat-template gemma
    assert named.template_text(["hi"]) == "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    with pytest.raises(InvalidInputError, match="jinja: the chat template is none of llama.cpp's built-in"):
        gguf(f"llamacpp:{model}", mmproj=str(mmproj), jinja=False, chat_template="{{ messages[0]['content'] }}")


def test_model_without_mmproj_is_a_clear_load_error(gguf_files):
    model, _ = gguf_files(QWEN)
    with pytest.raises(ModelLoadError, match="mmproj"):
        _load(model)


def test_missing_files_are_load_errors(gguf_files, tmp_path):
    model, mmproj = gguf_files(QWEN)
    with pytest.raises(ModelLoadError, match="no such model GGUF"):
        _load(tmp_path / "absent.gguf", mmproj=str(mmproj))
    with pytest.raises(ModelLoadError, match="no such mmproj GGUF"):
        _load(model, mmproj=str(tmp_path / "absent.gguf"))


def test_mismatched_or_wrong_mmproj_is_a_load_error(gguf_files, tmp_path):
    model, _ = gguf_files(QWEN)
    _, smol_mmproj = gguf_files(SMOL)
    with pytest.raises(ModelLoadError, match="vision projector"):
        _load(model, mmproj=str(smol_mmproj))  # projects into another embedding size
    with pytest.raises(ModelLoadError, match="vision projector"):
        _load(model, mmproj=str(model))  # a language model is no mmproj
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelLoadError):
        _load(junk, mmproj=str(junk))


def test_bad_files_write_nothing_to_the_store(gguf_files, photos, tmp_path):
    from refsight import Engine
    from refsight.backends.options import BackendOptions

    model, mmproj = gguf_files(QWEN)
    _, smol_mmproj = gguf_files(SMOL)
    photo = tmp_path / "cat.png"
    photos["chelsea"].image.save(photo)
    for options in (
        BackendOptions(mmproj=str(smol_mmproj)),  # made for another model
        BackendOptions(),  # no mmproj at all
        BackendOptions(mmproj=str(tmp_path / "absent.gguf")),
    ):
        with Engine(tmp_path / "store", model=f"llamacpp:{model}", backend_options=options) as engine:
            with pytest.raises(ModelLoadError):
                engine.add(photo, ref_id="cat")
            assert engine.stats().packages == 0
            assert engine.stats().references == 0
    # The same store then works with the right mmproj.
    with Engine(tmp_path / "store", model=f"llamacpp:{model}", backend_options=BackendOptions(mmproj=str(mmproj))) as engine:
        assert engine.add(photo, ref_id="cat").cached is False
        assert engine.stats().packages == 1


def test_unsupported_options_are_refused_by_name(gguf_files):
    model, mmproj = gguf_files(QWEN)
    for option, value in (("dtype", "bfloat16"), ("max_pixels", 1000), ("attn", "sdpa")):
        with pytest.raises(InvalidInputError, match=option):
            _load(model, mmproj=str(mmproj), **{option: value})
    with pytest.raises(InvalidInputError, match="image_max_tokens"):
        _load(model, mmproj=str(mmproj), image_max_tokens="many")
    with pytest.raises(InvalidInputError, match="do_resize"):
        _load(model, mmproj=str(mmproj), processor_kwargs={"do_resize": False})


def test_keys_change_with_mmproj_model_file_and_token_limits(gguf_files, photos, tmp_path):
    model, mmproj = gguf_files(QWEN)
    base = _load(model, mmproj=str(mmproj))
    variants = {
        "mmproj": _load(model, mmproj=str(_tweaked_copy(mmproj, tmp_path, "mmproj2.gguf"))),
        "model": _load(_tweaked_copy(model, tmp_path, "model2.gguf"), mmproj=str(mmproj)),
        "image_min_tokens": _load(model, mmproj=str(mmproj), image_min_tokens=16),
        "image_max_tokens": _load(model, mmproj=str(mmproj), processor_kwargs={"image_max_tokens": 16}),
    }
    image = photos["chelsea"]
    key = base.encode([image])[0].key
    keys = {what: backend.encode([image])[0].key for what, backend in variants.items()}
    assert key not in keys.values()
    assert len(set(keys.values())) == len(keys)
    # The same files under the same settings give the same key (content hashes, not paths).
    moved = shutil.copytree(model.parent, tmp_path / "moved")
    same = _load(moved / model.name, mmproj=str(moved / mmproj.name))
    assert same.encode([image])[0].key == key


def test_packages_of_another_encoder_are_refused(gguf, photos):
    from refsight.errors import CorruptPackageError

    package = gguf(SMOL).encode([photos["chelsea"]])[0]
    with pytest.raises(CorruptPackageError, match="another encoder"):
        gguf(QWEN).validate_package(package)


def test_token_limits_change_the_chunks(gguf_files, photos):
    model, mmproj = gguf_files(QWEN)
    small = _load(model, mmproj=str(mmproj), image_max_tokens=8).encode([photos["chelsea"]])[0]
    large = _load(model, mmproj=str(mmproj), image_min_tokens=16).encode([photos["chelsea"]])[0]
    default = _load(model, mmproj=str(mmproj)).encode([photos["chelsea"]])[0]

    def n(package):
        return sum(c["n_tokens"] for c in package.metadata["chunks"] if c["type"] == "image")

    assert n(small) <= 8 < n(default) < 16 <= n(large)


def test_impossible_token_limits_say_why(gguf_files):
    model, mmproj = gguf_files(QWEN)
    with pytest.raises(ModelLoadError, match="less than image_min_pixels"):
        _load(model, mmproj=str(mmproj), image_max_tokens=4)


def test_no_weight_is_placed_in_llama_cpps_amx_buffer(gguf, caplog):
    """llama.cpp's AMX matrix product crashed the process on the Q4_K_M model's first prompt (issue 20824): on a build
    with AMX kernels its weights stay in plain CPU memory; elsewhere llama.cpp places them as it always does."""
    from refsight.backends.llamacpp.logs import repack_weights

    quantized = gguf("tiny-gemma3-gguf-q4")  # built (quantized) on first use; loaded again here to see its load
    with caplog.at_level(logging.DEBUG, "refsight.llamacpp"):
        _load(quantized.model_path, mmproj=str(quantized.mmproj_path)).close()
    loaded = caplog.text  # llama.cpp's own load lines, through refsight's logger
    assert "model buffer size" in loaded and "AMX model buffer" not in loaded
    assert repack_weights() or "CPU_REPACK model buffer" not in loaded


@pytest.mark.parametrize(("system_info", "repack"), [
    ("CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | OPENMP = 1 | REPACK = 1 |", False),
    ("CPU : AVX2 = 1 | AVX512 = 1 | OPENMP = 1 | REPACK = 1 |", True),
])
def test_the_weights_are_repacked_unless_llama_cpp_has_amx_kernels(monkeypatch, caplog, system_info, repack):
    from refsight.backends.llamacpp import logs

    build = SimpleNamespace(llama_print_system_info=lambda: system_info.encode())
    monkeypatch.setattr(logs, "bindings", lambda: (build, None))
    logs.repack_weights.cache_clear()
    try:
        with caplog.at_level(logging.INFO, "refsight.llamacpp"):
            assert logs.repack_weights() is repack
            assert logs.repack_weights() is repack
        # Said once, at INFO, naming why and what llama-server users do instead.
        assert caplog.text.count("--no-repack") == (0 if repack else 1)
    finally:
        logs.repack_weights.cache_clear()  # the next load asks this build again
