"""The vllm backend's factory and registry entries, checked without a vLLM server.

Options are validated before the server is contacted, so these run in the main
test job (no ``vllm`` marker).
"""

from __future__ import annotations

import pytest


def test_vllm_prefix_resolves_to_the_vllm_factory():
    from refsight.backends.registry import resolve_factory
    from refsight.backends.vllm.backend import load_vllm_backend

    assert resolve_factory("vllm:http://127.0.0.1:1") is load_vllm_backend


def test_tiny_vllm_models_are_registered():
    from refsight.backends.registry import available_models

    assert {"tiny-qwen2-vl-vllm", "tiny-qwen2.5-vl-vllm", "tiny-qwen3-vl-vllm"} <= set(available_models())


@pytest.mark.parametrize("option", ["min_pixels", "max_pixels", "processor_kwargs", "mmproj", "no_such_option"])
def test_unsupported_options_are_refused_by_name(option):
    from refsight.backends.registry import get_backend
    from refsight.errors import InvalidInputError

    with pytest.raises(InvalidInputError) as info:
        get_backend("vllm:http://127.0.0.1:1", **{option: 1})
    assert info.value.input == option


@pytest.mark.parametrize("name", ["vllm:localhost:8000", "vllm:ftp://x"])
def test_a_url_without_http_is_refused(name):
    from refsight.backends.registry import get_backend
    from refsight.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="vllm:http://HOST:PORT"):
        get_backend(name)


def test_tiny_vllm_model_folder_has_what_vllm_loads(model_cache):
    """Chat template, processor and video-processor configs, and text heads of 32."""
    import json

    from refsight.backends.vllm.tiny import ensure_vllm_model_dir

    for name, system in (("tiny-qwen2-vl-vllm", True), ("tiny-qwen3-vl-vllm", False)):
        folder = ensure_vllm_model_dir(name)
        for file in ("chat_template.jinja", "processor_config.json", "video_preprocessor_config.json"):
            assert (folder / file).is_file(), file
        assert ("You are a helpful assistant." in (folder / "chat_template.jinja").read_text()) is system
        text = json.loads((folder / "config.json").read_text())["text_config"]
        assert (text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]) >= 32


def test_vllm_commands_are_in_the_cli():
    from refsight.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["vllm-serve", "tiny-qwen2-vl-vllm", "--port", "8123", "--image-limit", "0", "--json"])
    assert (args.model_name, args.port, args.image_limit) == ("tiny-qwen2-vl-vllm", 8123, 0)
    assert parser.parse_args(["vllm-env", "/tmp/x", "--json"]).dir == "/tmp/x"
