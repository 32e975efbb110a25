"""The ``vllm:http://HOST:PORT`` registry factory: the server's model, refsight's encoder for it, checked.

The encoder is the refsight model that holds the *same weights* as the served model (a
built-in name such as ``tiny-qwen2-vl-vllm``, ``hf:DIR``, a folder or a hub id; by
default the server's ``root`` from ``/v1/models``). It must be a transformers backend of
any family refsight serves (its tokenizer and processor say the reserved tokens, the yes/no
ids and the image token counts; its vision tower never runs in pixel mode); embeddings
(``images=embeds``, or a server without a vision encoder) are sent for the Qwen families only.
When the served model's config is readable here its type and embedding width must fit: vLLM
does not check the width of ``image_embeds`` and a wrong one kills its engine.

Whether the server runs its own vision encoder decides how images travel (pixel
packages and uuids, or embeddings: :mod:`.backend`); it is asked once, with a real tiny
image under a fresh uuid (:func:`server_encodes_images`: a server with image limit 0
answers "At most 0 image(s)"). Then whether it keeps what it was sent by uuid
(:func:`server_keeps_uuids`: the same uuid alone), so that a backend never sends uuid-only
parts to a server that cannot serve them: a server with ``--mm-processor-cache-gb 0``
answers "Failed to apply ...Processor on data={'images': [None]}" rather than "Cache miss",
and is a pixel server that keeps no uuids, not one without an encoder. ``images=`` (the
CLI's ``--vllm-images``) overrides the mode; a server that cannot take it is refused at load.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from ...errors import GenerationError, InvalidInputError, ModelLoadError
from .backend import EMBEDS_MODEL_TYPES, VLLMBackend
from .client import DEFAULT_TIMEOUT_S, VLLMClient
from .pixels import is_cache_miss

__all__ = [
    "VLLM_PREFIX", "IMAGE_MODES", "load_vllm_backend", "server_encodes_images", "server_keeps_uuids", "server_image_mode",
]

VLLM_PREFIX = "vllm:"
#: Options passed on to the encoder (refsight's HF backend for the same weights).
_ENCODER_OPTIONS = ("dtype", "device", "batch_size", "revision", "attn")
#: Options that would make refsight's preprocessing differ from the server's.
_SERVER_SIDE = ("min_pixels", "max_pixels", "processor_kwargs")
#: ``images=``: how images travel (default: asked of the server).
IMAGE_MODES = ("pixels", "embeds")


def _probe(served_model: str, uuid: str, url: str | None) -> dict[str, Any]:
    """A one-token request of one image part with ``uuid`` (``url`` None: uuid-only)."""
    return {
        "model": served_model, "max_tokens": 1, "temperature": 0.0,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": None if url is None else {"url": url}, "uuid": uuid},
            {"type": "text", "text": "?"},
        ]}],
    }


#: A tiny image no server holds a uuid for: each probe is one small encode.
_PROBE_SIDE = 32


def _probe_url() -> str:
    from PIL import Image

    from .messages import png_data_url

    return png_data_url(Image.new("RGB", (_PROBE_SIDE, _PROBE_SIDE), (127, 127, 127)))


def _refuses_images(message: str) -> bool:
    """vLLM's answer to pixels on a server started with image limit 0 (no vision encoder loaded)."""
    return "At most 0 image" in message


def server_encodes_images(client: VLLMClient, served_model: str, *, uuid: str | None = None) -> bool:
    """Whether the server takes ``image_url`` parts (it runs a vision encoder): a tiny image, one encode.

    A server with image limit 0 refuses it ("At most 0 image(s)"); any other refusal is
    no answer to the question, so it is raised. The uuid is fresh (``uuid``: the caller's,
    so that :func:`server_keeps_uuids` can ask for it next): no reference uuid, so an
    encoder-cache connector never keeps it.
    """
    try:
        client.chat(_probe(served_model, uuid or f"refsight-probe-{secrets.token_hex(8)}", _probe_url()))
    except GenerationError as error:
        if _refuses_images(str(error)):
            return False
        raise
    return True


def server_keeps_uuids(client: VLLMClient, served_model: str, *, sent: str | None = None) -> bool:
    """Whether a uuid sent with pixels is then served uuid-only (``sent``: a uuid the server was just given pixels for).

    A server that keeps nothing by uuid answers "Cache miss" (its caches forgot) or, with
    ``--mm-processor-cache-gb 0``, "Failed to apply ...Processor on data={'images': [None]}":
    both HTTP 400, both mean "send pixels every time".
    """
    if sent is None:
        sent = f"refsight-probe-{secrets.token_hex(8)}"
        client.chat(_probe(served_model, sent, _probe_url()))
    try:
        client.chat(_probe(served_model, sent, None))
    except GenerationError as error:
        if is_cache_miss(str(error)) or "HTTP 400" in str(error):
            return False
        raise
    return True


def server_image_mode(client: VLLMClient, served_model: str) -> tuple[str, bool]:
    """``(images, keeps_uuids)`` the server supports: ("pixels", True|False) or ("embeds", False); two tiny requests."""
    uuid = f"refsight-probe-{secrets.token_hex(8)}"
    if not server_encodes_images(client, served_model, uuid=uuid):
        return "embeds", False
    return "pixels", server_keeps_uuids(client, served_model, sent=uuid)


def _image_mode(name: str, client: VLLMClient, served_model: str, wanted: str | None) -> tuple[str, bool]:
    """The mode to use: the server's, or ``wanted`` when the server can take it (else a loud ModelLoadError)."""
    if wanted == "embeds":
        # Not probed: a server takes embeddings with --enable-mm-embeds (vllm-serve passes it) whatever
        # its encoder, and one without refuses the first request by name.
        return "embeds", False
    images, keeps_uuids = server_image_mode(client, served_model)
    if wanted == "pixels" and images != "pixels":
        raise ModelLoadError(name, "images=pixels (--vllm-images pixels), but this vLLM server has no vision encoder "
                                   "(image limit 0): it takes embeddings only; use images=embeds or start it with images")
    return images, keeps_uuids


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
        if key not in (*_ENCODER_OPTIONS, "images", "vllm_images"):
            raise InvalidInputError(
                key, f"not supported by the vllm backend; accepted: encoder, timeout, images (vllm_images), "
                f"{', '.join(_ENCODER_OPTIONS)}"
            )
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise InvalidInputError(f"timeout={timeout!r}", "must be a positive number of seconds")
    for key in ("images", "vllm_images"):
        if options.get(key) not in (None, *IMAGE_MODES):
            raise InvalidInputError(f"{key}={options[key]!r}", f"must be one of {', '.join(IMAGE_MODES)}")
    return url


def load_vllm_backend(name: str, *, encoder: str | None = None, timeout: float | None = None, **options: Any) -> VLLMBackend:
    """Registry factory for ``vllm:http://HOST:PORT``.

    ``encoder``: the refsight model that encodes for this server (a built-in name
    such as ``tiny-qwen2-vl-vllm``, ``hf:DIR``, a folder or a hub id); default: the
    server's model ``root`` from ``/v1/models``. ``timeout``: seconds per request.
    ``images`` (``vllm_images``, the CLI's ``--vllm-images``): ``pixels`` (the server encodes
    every image; references by uuid where it keeps them) or ``embeds`` (refsight encodes,
    vLLM gets embeddings); default: what the server supports (:func:`server_image_mode`);
    ``pixels`` on a server without a vision encoder is a ModelLoadError.
    ``dtype``, ``device``, ``batch_size``, ``revision``, ``attn`` go to the encoder;
    preprocessing options are refused (the server's processor decides, and the
    ``--no-cache`` pixel path must see the same images).
    """
    from ..registry import resolve_factory

    url = _check_options(name, options, timeout)
    client = VLLMClient(name, url, timeout=timeout or DEFAULT_TIMEOUT_S)
    served = client.models()[0]
    root = str(served.get("root") or served.get("id"))
    wanted = options.pop("vllm_images", None)
    wanted = options.pop("images", None) or wanted
    images, keeps_uuids = _image_mode(name, client, str(served["id"]), wanted)
    encoder_name = _encoder_name(encoder or root)
    backend = resolve_factory(encoder_name)(encoder_name, **{k: v for k, v in options.items() if v is not None})
    try:
        family = getattr(backend, "family", None)
        if family is None or getattr(backend, "tokenizer", None) is None:
            raise ModelLoadError(
                name, f"encoder {encoder_name} is {type(backend).__name__}; the vllm backend needs the transformers "
                "backend of the served weights (hf:DIR, a folder, a hub id or a built-in name)"
            )
        if images == "embeds" and family not in EMBEDS_MODEL_TYPES:
            raise ModelLoadError(
                name, f"encoder {encoder_name} is {family}: image embeddings go to vLLM for {', '.join(EMBEDS_MODEL_TYPES)} only; "
                "serve this model with its vision encoder (an image limit above 0) and use images=pixels"
            )
        _check_same_model(name, root, encoder_name, backend)
    except Exception:
        backend.close()
        raise
    return VLLMBackend(name, client=client, served_model=str(served["id"]), encoder=backend,
                       encodes_images=images == "pixels", keeps_uuids=keeps_uuids)


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

    from ..hf.model_source import NO_REMOTE_CODE

    try:
        served = AutoConfig.from_pretrained(root, local_files_only=True, **NO_REMOTE_CODE)
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
