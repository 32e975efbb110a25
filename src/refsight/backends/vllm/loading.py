"""The ``vllm:http://HOST:PORT`` registry factory: the server's model, refsight's encoder for it, checked.

The encoder is the refsight model that holds the *same weights* as the served model (a
built-in name such as ``tiny-qwen2-vl-vllm``, ``hf:DIR``, a folder or a hub id; by
default the server's ``root`` from ``/v1/models``). It must be a Qwen family backend,
and when the served model's config is readable here its embedding width must fit: vLLM
does not check the width of ``image_embeds`` and a wrong one kills its engine.
"""

from __future__ import annotations

import os
from typing import Any

from ...errors import InvalidInputError, ModelLoadError
from .backend import VLLMBackend
from .client import DEFAULT_TIMEOUT_S, VLLMClient

__all__ = ["VLLM_PREFIX", "load_vllm_backend"]

VLLM_PREFIX = "vllm:"
#: Options passed on to the encoder (refsight's HF backend for the same weights).
_ENCODER_OPTIONS = ("dtype", "device", "batch_size", "revision", "attn")
#: Options that would make refsight's preprocessing differ from the server's.
_SERVER_SIDE = ("min_pixels", "max_pixels", "processor_kwargs")
_QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def _encoder_name(encoder: str) -> str:
    """A refsight model name for ``encoder``: a registered name, ``hf:...``, or a folder."""
    from ..registry import HF_PREFIX, available_models

    if encoder.startswith(HF_PREFIX) or encoder in available_models():
        return encoder
    if os.path.isdir(os.path.expanduser(encoder)):
        return HF_PREFIX + os.path.abspath(os.path.expanduser(encoder))
    # A hub id, loaded the same way a user would with --model hf:ID.
    return HF_PREFIX + encoder


def _check_options(name: str, options: dict[str, Any], timeout: Any) -> str:
    """The server URL of ``name``; every option the backend cannot honour refused by name."""
    url = name[len(VLLM_PREFIX):] if name.startswith(VLLM_PREFIX) else name
    if not url.startswith(("http://", "https://")):
        raise InvalidInputError(name, "expected vllm:http://HOST:PORT")
    for key in options:
        if key in _SERVER_SIDE:
            raise InvalidInputError(key, "not supported by the vllm backend: preprocessing is the vLLM server's (start it with --mm-processor-kwargs)")
        if key not in _ENCODER_OPTIONS:
            raise InvalidInputError(key, f"not supported by the vllm backend; accepted: encoder, timeout, {', '.join(_ENCODER_OPTIONS)}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise InvalidInputError(f"timeout={timeout!r}", "must be a positive number of seconds")
    return url


def load_vllm_backend(name: str, *, encoder: str | None = None, timeout: float | None = None, **options: Any) -> VLLMBackend:
    """Registry factory for ``vllm:http://HOST:PORT``.

    ``encoder``: the refsight model that encodes for this server (a built-in name
    such as ``tiny-qwen2-vl-vllm``, ``hf:DIR``, a folder or a hub id); default: the
    server's model ``root`` from ``/v1/models``. ``timeout``: seconds per request.
    ``dtype``, ``device``, ``batch_size``, ``revision``, ``attn`` go to the encoder;
    preprocessing options are refused (the server's processor decides, and the
    ``--no-cache`` pixel path must see the same images).
    """
    from ..registry import resolve_factory

    url = _check_options(name, options, timeout)
    client = VLLMClient(name, url, timeout=timeout or DEFAULT_TIMEOUT_S)
    served = client.models()[0]
    root = str(served.get("root") or served.get("id"))
    encoder_name = _encoder_name(encoder or root)
    backend = resolve_factory(encoder_name)(encoder_name, **{k: v for k, v in options.items() if v is not None})
    try:
        family = getattr(backend, "family", None)
        if family not in _QWEN_FAMILIES:
            raise ModelLoadError(
                name, f"encoder {encoder_name} is {family or type(backend).__name__}; the vllm backend serves {', '.join(_QWEN_FAMILIES)}"
            )
        _check_same_model(name, root, encoder_name, backend)
    except Exception:
        backend.close()
        raise
    return VLLMBackend(name, client=client, served_model=str(served["id"]), encoder=backend)


def _embedding_width(config: Any) -> tuple[str, int]:
    """(model type, width of one image-embedding row vLLM expects) from a Qwen-VL config."""
    text = getattr(config, "text_config", config)
    deepstack = len(getattr(getattr(config, "vision_config", None), "deepstack_visual_indexes", None) or [])
    return str(getattr(config, "model_type", "")), int(text.hidden_size) * (1 + deepstack)


def _check_same_model(name: str, root: str, encoder_name: str, encoder: Any) -> None:
    """Refuse an encoder whose embeddings the served model cannot take.

    vLLM does not check the width of ``image_embeds``: a wrong one kills its engine
    (HTTP 500, then every request fails). So the served model's config is read, when
    refsight can read it (a local folder, or a hub id in the local cache), and its type
    and embedding width are compared with the encoder's before anything is sent.
    """
    from transformers import AutoConfig

    try:
        served = AutoConfig.from_pretrained(root, local_files_only=True)
    except Exception:  # noqa: BLE001 - a remote server's model may not be readable here
        return
    theirs = _embedding_width(served)
    ours = _embedding_width(encoder.model.config)
    if theirs != ours:
        raise ModelLoadError(
            name,
            f"encoder {encoder_name} ({ours[0]}, embeddings {ours[1]} wide) does not fit the served model "
            f"{root} ({theirs[0]}, {theirs[1]} wide); give encoder= with the server's weights",
        )
