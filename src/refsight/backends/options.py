"""How a model is loaded: one definition of the backend options, shared by Engine, CLI and server.

:class:`BackendOptions` holds what a user may set about a model runtime (device, dtype,
attention implementation, image-processor settings, revision, batch size, and the
runtime-specific files such as llama.cpp's ``mmproj``). Only the options a user actually
set reach the backend factory (:meth:`BackendOptions.as_kwargs`), so each backend keeps
its own defaults and refuses, by name, an option it does not support.

The CLI flags (``--device``, ``--dtype`` ...) and the server's settings are built from
this one definition (:data:`OPTION_HELP`), so the three front ends can never drift apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from ..errors import InvalidInputError

__all__ = ["BackendOptions", "OPTION_HELP", "DEVICES", "DTYPES", "FLASH_ATTN", "parse_key_values"]

#: Accepted ``device`` values (``cuda:N`` names one GPU).
DEVICES = ("auto", "cpu", "cuda", "mps")
#: Accepted ``dtype`` values.
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: Accepted ``flash_attn`` values (llama-server's ``-fa``).
FLASH_ATTN = ("auto", "on", "off")
#: Accepted ``vllm_images`` values (how a ``vllm:`` backend sends images).
VLLM_IMAGES = ("pixels", "embeds")
#: Accepted ``n_ctx_over_trained`` values: what llama.cpp does with a context above the model's trained one.
N_CTX_OVER_TRAINED = ("refuse", "cap")

#: The options that take one of a few values, and those values.
_CHOICES = {"dtype": DTYPES, "flash_attn": FLASH_ATTN, "vllm_images": VLLM_IMAGES, "n_ctx_over_trained": N_CTX_OVER_TRAINED}

#: The options of one kind each, what a value of it is, and what the error says it must be (unset is always fine).
_KINDS = (
    (("jinja",), lambda v: isinstance(v, bool), "must be true or false"),
    (("min_pixels", "max_pixels", "batch_size", "n_ctx", "parallel"),
     lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "must be a positive integer"),
    (("attn", "revision", "mmproj", "encoder", "chat_template"),
     lambda v: isinstance(v, str) and bool(v.strip()), "must be a non-empty string"),
)

_DEVICE = re.compile(r"(auto|cpu|mps|cuda(:\d{1,3})?)")

#: One line of help per option, used by the CLI flags and the docs.
OPTION_HELP: dict[str, str] = {
    "device": "where the model runs: auto, cpu, cuda, cuda:N or mps",
    "dtype": "weights and features dtype: auto, float32, bfloat16 or float16",
    "attn": "attention implementation (e.g. sdpa, eager, flash_attention_2)",
    "min_pixels": "smallest image area the processor resizes to (Qwen)",
    "max_pixels": "largest image area the processor resizes to (Qwen); bounds image tokens",
    "processor_kwargs": "any other image-processor setting, KEY=VALUE (repeatable)",
    "revision": "hub revision (branch, tag or commit); resolved to a commit before use",
    "batch_size": "images encoded per forward pass",
    "mmproj": "llama.cpp: the multimodal projector GGUF beside the model GGUF",
    "encoder": "vLLM: the local weights refsight encodes with (a directory or a model name)",
    "flash_attn": "llama.cpp: flash attention on, off or auto (llama-server's -fa; with --parallel: off)",
    "vllm_images": "vLLM: how images travel, pixels (the server encodes) or embeds (refsight encodes); default: "
                   "what the server supports; an error when it cannot",
}


@dataclass(frozen=True)
class BackendOptions:
    """Options for loading a model; ``None`` (or an empty mapping) means "the backend's default"."""

    device: str | None = None
    dtype: str | None = None
    attn: str | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    processor_kwargs: Mapping[str, Any] = field(default_factory=dict)
    revision: str | None = None
    batch_size: int | None = None
    mmproj: str | None = None
    encoder: str | None = None
    #: The context in tokens, where the runtime has a limit (llama.cpp's ``n_ctx``; ``refsight serve -c``).
    n_ctx: int | None = None
    #: Requests decoded together, each its own sequence (llama.cpp; ``refsight serve --parallel``).
    parallel: int | None = None
    #: llama.cpp's flash attention: "auto", "on" or "off" (llama-server's ``-fa``; ``refsight serve -fa``).
    flash_attn: str | None = None
    #: vLLM: "pixels" or "embeds" (``--vllm-images``); None: what the server supports (asked at load).
    vllm_images: str | None = None
    #: A Jinja chat template that replaces the model's own for rendering chats (``refsight serve
    #: --chat-template``/``--chat-template-file``); applied by the registry after the load (:func:`~.registry.get_backend`).
    chat_template: str | None = None
    #: False (``refsight serve --no-jinja``, as llama-server's): chats render in llama.cpp's built-in format detected
    #: from the chat template (``chat_template``, a built-in name or a template's text, else the model's own), as
    #: llama-server renders them without Jinja; applied by the registry after the load, as ``chat_template`` is.
    jinja: bool | None = None
    #: llama.cpp, a context (``n_ctx``) above the one the model was trained for: "refuse" (the default: an error
    #: naming both) or "cap" (a warning, and each slot's context is the trained one: llama-server's ``-c``).
    n_ctx_over_trained: str | None = None

    def __post_init__(self) -> None:
        self._check_values()
        self._check_pixels()
        if not isinstance(self.processor_kwargs, Mapping) or not all(
            isinstance(k, str) and k for k in self.processor_kwargs
        ):
            raise InvalidInputError("processor_kwargs", "must map setting names to values")
        # A private, sorted copy: options are compared and hashed by value.
        object.__setattr__(self, "processor_kwargs", dict(sorted(self.processor_kwargs.items())))

    def _check_values(self) -> None:
        """Each option set has its kind's type and range: a device name, one of its choices, or a value of its kind
        (:data:`_KINDS`)."""
        if self.device is not None and not (isinstance(self.device, str) and _DEVICE.fullmatch(self.device)):
            raise InvalidInputError(f"device {self.device!r}", f"use one of {', '.join(DEVICES)} or cuda:N")
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if value is not None and value not in choices:
                raise InvalidInputError(f"{name} {value!r}", f"use one of {', '.join(choices)}")
        for names, fits, must in _KINDS:
            for name in names:
                value = getattr(self, name)
                if value is not None and not fits(value):
                    raise InvalidInputError(name, f"{must}, got {value!r}")

    def _check_pixels(self) -> None:
        """The image area bounds in order (each is already a positive integer or unset)."""
        if self.min_pixels and self.max_pixels and self.min_pixels > self.max_pixels:
            raise InvalidInputError("min_pixels", f"{self.min_pixels} is larger than max_pixels {self.max_pixels}")

    def as_kwargs(self) -> dict[str, Any]:
        """The options the user set, as keyword arguments for a backend factory."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name == "processor_kwargs" and not value):
                continue
            out[f.name] = dict(value) if f.name == "processor_kwargs" else value
        return out

    def merged(self, override: "BackendOptions | None") -> "BackendOptions":
        """These options with every option set in ``override`` taking precedence (CLI over config file)."""
        if override is None:
            return self
        changes = override.as_kwargs()
        if "processor_kwargs" in changes:
            changes["processor_kwargs"] = {**self.processor_kwargs, **changes["processor_kwargs"]}
        return replace(self, **changes)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "options") -> "BackendOptions":
        """Options from a mapping (a config file section, a JSON body); unknown names are refused."""
        if not isinstance(data, Mapping):
            raise InvalidInputError(source, "backend options must be a table of NAME = VALUE")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidInputError(f"{source}: {', '.join(unknown)}", f"unknown option(s); known: {', '.join(sorted(known))}")
        return cls(**dict(data))


def parse_key_values(items: list[str] | tuple[str, ...], *, flag: str) -> dict[str, Any]:
    """``["KEY=VALUE", ...]`` → a dict; values that read as JSON numbers or booleans become them."""
    import json

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidInputError(f"{flag} {item!r}", "expected KEY=VALUE")
        try:
            parsed = json.loads(value)
            out[key.strip()] = parsed if isinstance(parsed, (int, float, bool)) else value
        except ValueError:
            out[key.strip()] = value
    return out
