"""Shared logic of the Hugging Face transformers backends.

:class:`HFBackend` does everything that is the same for every model family:
loading through ``from_pretrained`` (hub id or local directory) on the chosen
device, dtype and attention implementation; the revision (a hub commit, or the
content hash of a local checkpoint: :mod:`.revision`); the fingerprint; batched
encoding; and generation (greedy by default; sampling, stop strings, streaming and
cancellation through :mod:`.decoding`) through transformers' seam for precomputed
features (``mm_encoder_outputs``), so a cached reference runs no vision tower and
no image processor. A family subclass (``qwen2_vl.py``, ``qwen3_vl.py``,
``smolvlm.py``) knows only its own package contents, its placeholder layout and
its chat template.

Packages are always stored on the CPU; their tensors move to the model's device
when a prompt uses them. Runtime exceptions become refsight errors in one place,
:func:`runtime_errors` (out-of-memory named as such, with dtype and device).
"""

from __future__ import annotations

import abc
import contextlib
import importlib.util
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping, Sequence

from ...errors import (
    BackendError,
    CorruptPackageError,
    GenerationError,
    InvalidInputError,
    ModelLoadError,
    RefsightError,
)
from ...images import ImageInput
from ...package import EncoderFingerprint, VisualPackage
from ..base import Backend, Generation, GenerationRequest, TextCallback
from ..sampling import SAMPLING_FIELDS
from .revision import directory_revision
from .runtime import to_device

__all__ = ["HFBackend", "runtime_errors", "weights_revision", "refuse_other_backend_options", "MARKER_FILE"]

#: A JSON file refsight writes next to the weights of the models it builds
#: (``{"random_weights": true, "model_id": ...}``); real checkpoints have none.
MARKER_FILE = "refsight_model.json"

# Keys of an image processor's ``to_dict()`` that name the class, not a setting.
_NON_SETTINGS = {"image_processor_type", "processor_class", "_processor_class", "_valid_processor_keys", "backend"}

#: Backend options that belong to other runtimes: the transformers backends refuse them by name.
_OTHER_RUNTIMES = {"mmproj": "the llama.cpp backend", "encoder": "the vLLM backend"}

#: The revision of a local checkpoint directory (kept under its old name).
weights_revision = directory_revision


def refuse_other_backend_options(options: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidInputError` naming an option of another runtime (``mmproj``, ``encoder``)."""
    for option, owner in _OTHER_RUNTIMES.items():
        if options.get(option) is not None:
            raise InvalidInputError(
                option, f"is an option of {owner}; the transformers backends (hf:, tiny-*, shape-*) do not use it"
            )


@contextlib.contextmanager
def runtime_errors(
    model: str, error: type[BackendError] = BackendError, what: str = "", *, device: str = "", dtype: str = ""
) -> Iterator[None]:
    """Turn any non-refsight exception raised inside into ``error(model, reason)``.

    The one place where torch / transformers exceptions become refsight errors;
    refsight's own errors pass through unchanged. Running out of memory says so,
    with the dtype and device and what to change, and returns the allocator's
    cache so the process can go on serving smaller requests.
    """
    try:
        yield
    except RefsightError:
        raise
    except (Exception, MemoryError) as e:  # translating is the point
        from .runtime import OOM_HINT, is_out_of_memory, release_memory

        prefix = f"{what}: " if what else ""
        if is_out_of_memory(e):
            release_memory(device or "cpu")
            placement = f" (dtype {dtype or '?'} on device {device or '?'})"
            raise error(model, f"{prefix}out of memory{placement}; {OOM_HINT}. {type(e).__name__}: {e}") from e
        raise error(model, f"{prefix}{type(e).__name__}: {e}") from e


def _constrained_available() -> bool:
    try:
        return importlib.util.find_spec("refsight.backends.hf.constrained") is not None
    except (ImportError, ValueError):
        return False


def _jsonable(value: Any) -> Any:
    """Settings as plain JSON values (enums, tuples and numpy scalars included)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "value"):  # enums such as PILImageResampling
        return _jsonable(value.value)
    return str(value)




class HFBackend(Backend):
    """A transformers VLM behind refsight; subclasses implement one model family.

    Construct through :func:`refsight.backends.hf.load_hf_backend` (or
    :meth:`from_pretrained`), not directly.
    """

    supports_cached_features: ClassVar[bool] = True
    sampling_fields: ClassVar[frozenset[str]] = frozenset(SAMPLING_FIELDS)
    supports_turns: ClassVar[bool] = True
    supports_streaming: ClassVar[bool] = True
    #: Reuses reference-prefix states (past key/values) across requests: :mod:`.prefix_cache`.
    supports_prefix_cache: ClassVar[bool] = True
    #: Short family name, part of the fingerprint ("qwen2_vl", "qwen3_vl", "smolvlm").
    family: ClassVar[str] = ""
    #: ``config.model_type`` values this family serves.
    model_types: ClassVar[tuple[str, ...]] = ()
    #: Special tokens a user's text may not contain (they would shift the placeholders).
    reserved_tokens: ClassVar[tuple[str, ...]] = ()
    #: Family-specific load options beyond :class:`~refsight.backends.options.BackendOptions`
    #: (SmolVLM's ``tile_size`` ...), mapped onto the image processor by :meth:`processor_overrides`.
    processor_options: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        name: str,
        *,
        model: Any,
        tokenizer: Any,
        image_processor: Any,
        model_id: str,
        revision: str,
        random_weights: bool = False,
        batch_size: int = 4,
        device: str = "cpu",
    ) -> None:
        super().__init__(name)
        self.model = model
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.model_id = model_id
        self.revision = revision
        self.random_weights = bool(random_weights)
        self.batch_size = int(batch_size)
        #: Where the model runs ("cpu", "cuda:0", "mps"); packages stay on the CPU.
        self.device = device
        self.supports_constrained_decoding = _constrained_available()
        # Batches are padded on the left so every row's last token is at the same position.
        self.tokenizer.padding_side = "left"
        # Computed now, from the settings as loaded: later changes to the processor
        # object (or test instrumentation on it) must not change what keys mean.
        self._fingerprint: EncoderFingerprint | None = None
        self._fingerprint = self.fingerprint()

    def count_text_tokens(self, text: str) -> int:
        """The exact number of tokens the model's tokenizer makes of ``text`` (no special tokens added)."""
        with runtime_errors(self.name, BackendError, "cannot tokenize"):
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(
        cls,
        name: str,
        source: str,
        config: Any,
        *,
        model_id: str | None = None,
        revision: str | None = None,
        dtype: str | None = None,
        device: str | None = None,
        attn: str | None = None,
        batch_size: int | None = None,
        processor_kwargs: Mapping[str, Any] | None = None,
        random_weights: bool | None = None,
        **options: Any,
    ) -> "HFBackend":
        """Load model, tokenizer and image processor from ``source`` (hub id or directory).

        Takes every :class:`~refsight.backends.options.BackendOptions` field except the
        other runtimes' ``mmproj`` / ``encoder`` (refused by name), plus the family's
        :attr:`processor_options`. Options are checked and the image processor is built
        and tried before the (possibly slow) weight load.
        """
        from transformers import AutoTokenizer

        from .preprocessing import check_processor_kwargs, probe_processor
        from .revision import resolve_hub_revision
        from .runtime import resolve_device, resolve_dtype

        refuse_other_backend_options(options)
        options = {k: v for k, v in options.items() if k not in _OTHER_RUNTIMES}
        accepted = {"min_pixels", "max_pixels", *cls.processor_options}
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise InvalidInputError(
                ", ".join(unknown), f"unknown option(s) for {cls.family}; accepted: {', '.join(sorted(accepted))}"
            )
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
            raise InvalidInputError("batch_size", f"must be a positive integer, got {batch_size!r}")
        local = os.path.isdir(source)
        if local and revision is not None:
            raise InvalidInputError(
                "revision", f"applies to hub models; {source} is a local directory, named by the hash of its files"
            )
        device_name = resolve_device(device)
        torch_dtype = resolve_dtype(dtype, device_name, config)
        dtype_name = str(torch_dtype).removeprefix("torch.")
        # A branch or tag moves: pin the commit now and load every file at it.
        commit = None if local else resolve_hub_revision(name, source, revision)
        hub = {} if local else {"revision": commit}

        processor_class = cls.image_processor_class()
        user_settings = check_processor_kwargs(processor_class, processor_kwargs)
        with runtime_errors(name, ModelLoadError, f"cannot load the image processor of {source}"):
            base_processor = processor_class.from_pretrained(source, **hub)
        mapped = cls.processor_overrides(options, base_processor)
        clash = sorted(set(mapped) & set(user_settings))
        if clash:
            raise InvalidInputError(
                f"processor_kwargs: {', '.join(clash)}", "also set by a dedicated option (--min/max-pixels ...); set it once"
            )
        overrides = {**user_settings, **mapped}
        image_processor = base_processor
        if overrides:
            try:
                image_processor = processor_class.from_pretrained(source, **hub, **overrides)
            except Exception as e:  # noqa: BLE001 - a bad value of a setting the user named
                raise InvalidInputError(
                    f"processor settings {', '.join(sorted(overrides))}", f"{type(e).__name__}: {e}"
                ) from None
            probe_processor(image_processor, list(overrides))

        load: dict[str, Any] = {"config": config, "dtype": torch_dtype, **hub}
        if attn is not None:
            load["attn_implementation"] = attn
        if device_name != "cpu":
            # Straight onto the accelerator: a large checkpoint never sits whole in host memory.
            load["device_map"] = {"": device_name}
        what = f"cannot load {source}" + (f" with attn={attn!r}" if attn else "")
        with runtime_errors(name, ModelLoadError, what, device=device_name, dtype=dtype_name):
            model = cls.model_class().from_pretrained(source, **load)
            model.eval()
            tokenizer = AutoTokenizer.from_pretrained(source, **hub)
        marker = _read_marker(source)
        if random_weights is None:
            random_weights = bool(marker.get("random_weights", False))
        return cls(
            name,
            model=model,
            tokenizer=tokenizer,
            image_processor=image_processor,
            model_id=model_id or marker.get("model_id") or source,
            revision=directory_revision(source) if local else commit,
            random_weights=random_weights,
            batch_size=batch_size or 4,
            device=device_name,
        )

    @classmethod
    @abc.abstractmethod
    def model_class(cls) -> Any:
        """The transformers ``*ForConditionalGeneration`` class of this family."""

    @classmethod
    @abc.abstractmethod
    def image_processor_class(cls) -> Any:
        """The PIL image processor class of this family (no torchvision needed)."""

    @classmethod
    def processor_overrides(cls, options: dict[str, Any], processor: Any) -> dict[str, Any]:
        """Image-processor settings from the load options (``min_pixels`` ...), given the checkpoint's processor.

        The base class maps nothing and refuses ``min_pixels`` / ``max_pixels``; families override.
        """
        for key in ("min_pixels", "max_pixels"):
            if options.get(key) is not None:
                raise InvalidInputError(key, f"is not a setting of the {cls.family} image processor")
        return {}

    # -------------------------------------------------------------- fingerprint

    def fingerprint(self) -> EncoderFingerprint:
        """Backend, model id, revision, dtype, processor class and settings, attention and vision-merge settings."""
        if self._fingerprint is None:
            settings = {
                k: v
                for k, v in self.image_processor.to_dict().items()
                if k not in _NON_SETTINGS and not callable(v)
            }
            settings = _jsonable(settings)
            settings["family"] = self.family
            settings["model"] = _jsonable(self.model_settings())
            # The class actually run (the saved config may name a torchvision twin):
            # two implementations of one processor need not agree to the last bit.
            settings["processor"] = type(self.image_processor).__name__
            settings["attn_implementation"] = self.attn_implementation()
            self._fingerprint = EncoderFingerprint(
                backend=f"hf-{self.family}",
                model_id=self.model_id,
                revision=self.revision,
                dtype=str(self.model.dtype).removeprefix("torch."),
                preprocessing=settings,
            )
        return self._fingerprint

    def attn_implementation(self) -> dict[str, str]:
        """The attention kernels in use, per (sub-)config: they change features beyond rounding."""
        config = self.model.config
        out = {}
        for part, holder in (("model", config), ("text", getattr(config, "text_config", None)), ("vision", getattr(config, "vision_config", None))):
            value = getattr(holder, "_attn_implementation", None) if holder is not None else None
            if value is not None:
                out[part] = str(value)
        return out

    def model_settings(self) -> dict[str, Any]:
        """Model-side settings that shape the features (merge size, deepstack layers ...)."""
        return {}

    # ------------------------------------------------------------------- encode

    @property
    def dtype_name(self) -> str:
        """The model's dtype as text ("float32", "bfloat16" ...)."""
        return str(self.model.dtype).removeprefix("torch.")

    def encode(self, images: Sequence[ImageInput]) -> list[VisualPackage]:
        """Encode images in batches of ``batch_size`` through the vision tower and projector.

        Packages come back on the CPU (that is how they are stored) with a
        ``provenance`` record in their metadata: device, library versions and date,
        which describe the encode but are not part of the key.
        """
        import torch

        from .runtime import provenance

        images = list(images)
        for i, image in enumerate(images):
            if not isinstance(image, ImageInput):
                raise InvalidInputError(f"images[{i}]", f"expected an ImageInput (use refsight.load_image), got {type(image).__name__}")
        fingerprint = self.fingerprint()
        packages: list[VisualPackage] = []
        step = max(1, self.batch_size)
        for start in range(0, len(images), step):
            batch = images[start : start + step]
            began = time.perf_counter()
            with runtime_errors(
                self.name, BackendError, "encode failed", device=self.device, dtype=self.dtype_name
            ), torch.inference_mode():
                encoded = self.encode_pils([image.image for image in batch])
                encoded = [({k: v.cpu() for k, v in tensors.items()}, metadata) for tensors, metadata in encoded]
            # One forward serves the whole batch; each package carries its share of the time.
            share = (time.perf_counter() - began) * 1000 / len(batch)
            made = provenance(self.device)
            for image, (tensors, metadata) in zip(batch, encoded):
                packages.append(
                    VisualPackage(
                        tensors=tensors,
                        metadata={**metadata, "provenance": dict(made)},
                        image_sha256=image.sha256,
                        fingerprint=fingerprint,
                        encode_ms=share,
                    )
                )
        return packages

    @abc.abstractmethod
    def encode_pils(self, images: list[Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Run image processor + ``get_image_features`` on RGB PIL images: (tensors, metadata) each.

        Inputs go to :attr:`device` in the model's dtype; the tensors may come back on the device.
        """

    # --------------------------------------------------------- package checking

    def validate_package(self, package: VisualPackage) -> None:
        """Fingerprint equal, expected tensor names, and shapes that agree with the metadata."""
        if not isinstance(package, VisualPackage):
            raise InvalidInputError(repr(package)[:80], "expected a VisualPackage")
        mine = self.fingerprint()
        if package.fingerprint != mine:
            theirs, ours = package.fingerprint.to_dict(), mine.to_dict()
            fields = [k for k in ours if theirs.get(k) != ours[k]]
            if "preprocessing" in fields:
                fields.remove("preprocessing")
                pre_t, pre_o = theirs["preprocessing"], ours["preprocessing"]
                fields += [f"preprocessing.{k}" for k in sorted(set(pre_t) | set(pre_o)) if pre_t.get(k) != pre_o.get(k)]
            raise CorruptPackageError(
                package.key, f"made by another encoder than {self.name} (differs in: {', '.join(fields)})"
            )
        try:
            self.check_package(package)
        except CorruptPackageError:
            raise
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise CorruptPackageError(package.key, f"malformed metadata or tensors: {type(e).__name__}: {e}") from None

    @abc.abstractmethod
    def check_package(self, package: VisualPackage) -> None:
        """Family checks: raise :class:`CorruptPackageError` when shapes and metadata disagree."""

    # ----------------------------------------------------------------- prompts

    @abc.abstractmethod
    def image_placeholder(self, package: VisualPackage) -> str:
        """The expanded placeholder text of one image (its token count from the metadata)."""

    @abc.abstractmethod
    def chat_prompt(self, parts: list[str]) -> str:
        """Wrap the user turn (text and placeholder strings, in order) in the family's chat template."""

    def chat_prompt_turns(self, turns: list[tuple[str, list[str]]]) -> str:
        """Wrap several turns (``(role, parts)``, roles system/user/assistant) in the chat template.

        Families override it; this default serves only the single user turn.
        """
        if len(turns) == 1 and turns[0][0] == "user":
            return self.chat_prompt(turns[0][1])
        raise InvalidInputError("messages", f"{self.family or self.name} renders a single user turn only")

    def build_prompt(self, segments: Sequence[str | VisualPackage], turns: list[tuple[str, int]] | None = None) -> str:
        """The full prompt text of one request whose images are all packages by now.

        Without ``turns`` it is one user turn, exactly as :meth:`chat_prompt` renders it.
        """
        parts = [s if isinstance(s, str) else self.image_placeholder(s) for s in segments]
        if turns is None:
            return self.chat_prompt(parts)
        split, start = [], 0
        for role, count in turns:
            split.append((role, parts[start:start + count]))
            start += count
        return self.chat_prompt_turns(split)

    def image_token_count(self, package: VisualPackage) -> int:
        """Prompt tokens one image takes (its placeholder, tokenized)."""
        return len(self.tokenizer(self.image_placeholder(package), add_special_tokens=False)["input_ids"])

    @abc.abstractmethod
    def multimodal_inputs(self, packages: list[VisualPackage], input_ids: Any) -> dict[str, Any]:
        """Keyword arguments for ``generate``: ``mm_encoder_outputs`` and the family's extras."""

    # ----------------------------------------------------------------- generate

    def _package_rows(self, requests: list[GenerationRequest]) -> tuple[list[list[Any]], int, float]:
        """Check ``requests`` and their packages, encode their fresh images with :meth:`encode` (the
        references' code), and return each request's segments with packages in place of images,
        the number of fresh images and their encode time (ms)."""
        self.check_requests(requests)
        for request in requests:
            for package in request.packages:
                self.validate_package(package)
        fresh = [image for request in requests for image in request.fresh_images]
        began = time.perf_counter()
        fresh_packages = iter(self.encode(fresh)) if fresh else iter(())
        encode_ms = (time.perf_counter() - began) * 1000
        rows = [[next(fresh_packages) if isinstance(s, ImageInput) else s for s in r.segments] for r in requests]
        return rows, len(fresh), encode_ms

    def generate(self, requests: Sequence[GenerationRequest], *, return_logits: bool = False) -> list[Generation]:
        """Generation for a batch (greedy unless ``sampling`` says otherwise); cached packages skip the vision tower.

        Fresh images are encoded first with :meth:`encode` (the same code as for
        references) and then take the same ``mm_encoder_outputs`` seam. Requests
        with a ``json_schema`` are constrained row by row in the same batch.
        """
        requests = list(requests)
        rows, fresh, encode_ms = self._package_rows(requests)
        per_image_ms = encode_ms / fresh if fresh else 0.0

        schemas = [r.json_schema for r in requests]
        # One generate call for the whole batch: the JSON processor constrains row by row
        # (None leaves a row free), so constrained and free requests can share a batch.
        processor = self._json_processor(schemas) if any(x is not None for x in schemas) else None
        outs, lm_ms = self._run(rows, requests, return_logits, processor)
        return [
            self._finish(out, lm_ms, per_image_ms * len(request.fresh_images), row, request)
            for out, row, request in zip(outs, rows, requests)
        ]

    def generate_stream(
        self, request: GenerationRequest, *, on_text: TextCallback, stop_event: threading.Event | None = None
    ) -> Generation:
        """One request, its text handed to ``on_text`` token by token from inside ``model.generate``.

        The same prompt, processors and decoding as :meth:`generate` (so a greedy stream
        equals the non-streamed text); a set ``stop_event`` ends generation after the
        current token.
        """
        from .decoding import TextStreamer

        (row,), _, encode_ms = self._package_rows([request])
        processor = self._json_processor([request.json_schema]) if request.json_schema is not None else None
        decode = lambda tokens: self.tokenizer.decode(tokens, skip_special_tokens=True)  # noqa: E731
        streamer = TextStreamer(decode, on_text, request.sampling.stop)
        outs, lm_ms = self._run([row], [request], False, processor, streamer=streamer, stop_event=stop_event)
        return self._finish(outs[0], lm_ms, encode_ms, row, request)

    def check_text(self, text: str, where: str) -> None:
        """Refuse text holding one of the family's special tokens (it would shift the placeholders)."""
        for token in self.reserved_tokens:
            if token in text:
                raise InvalidInputError(where, f"text may not contain the special token {token}")

    def _json_processor(self, schemas: list[dict[str, Any] | None]) -> Any:
        if not self.supports_constrained_decoding:
            raise BackendError(self.name, "constrained decoding is not available (refsight.backends.hf.constrained missing)")
        from . import constrained  # lazy: only requests with a schema pay for it

        vocab_size = self.model.get_output_embeddings().weight.shape[0]
        for i, schema in enumerate(schemas):
            if schema is not None and not isinstance(schema, dict):
                raise InvalidInputError(f"requests[{i}].json_schema", "a JSON schema must be a dict")
        with runtime_errors(self.name, GenerationError, "cannot build the JSON constraint"):
            return constrained.make_json_logits_processor(
                self.tokenizer, schemas, vocab_size, stop_token_ids=self._eos_ids() or None
            )

    def _eos_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]

    def _run(
        self, rows: list[list[Any]], requests: list[GenerationRequest], return_logits: bool, logits_processor: Any,
        *, streamer: Any = None, stop_event: threading.Event | None = None,
    ) -> tuple[list[dict[str, Any]], float]:
        """One ``model.generate`` call over ``rows``; returns per-row results and its ms.

        Each row's result holds ``tokens``, ``logits``, ``prompt_tokens`` and
        ``finish_reason``. Sampling, stop strings and cancellation ride on logits
        processors and stopping criteria (:mod:`.decoding`); ``generate`` itself stays
        greedy, so a request that asks for nothing decodes exactly as before.
        """
        import torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        from .decoding import CancelOnEvent, SamplingProcessor, StopStrings

        max_new_tokens = [r.max_new_tokens for r in requests]
        texts = [self.build_prompt(row, request.turns) for row, request in zip(rows, requests)]
        packages = [s for row in rows for s in row if isinstance(s, VisualPackage)]
        eos_ids = self._eos_ids()
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos_ids or [0])[0]
        decode = lambda tokens: self.tokenizer.decode(tokens, skip_special_tokens=True)  # noqa: E731
        plan = None
        began = time.perf_counter()
        with runtime_errors(
            self.name, GenerationError, "generation failed", device=self.device, dtype=self.dtype_name
        ), torch.inference_mode():
            if any(r.prefix_cache is not None for r in requests):
                from .prefix_cache import plan_prefixes

                plan = plan_prefixes(self, rows, requests, texts)
            if plan is not None:
                # Reference prefixes from their stored states: only the suffixes are prefilled.
                encoded, extra = plan.inputs()
            else:
                encoded = self.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
                encoded = {k: to_device(v, self.device) for k, v in encoded.items()}
                # Packages are stored on the CPU; their tensors join the prompt on the model's device.
                extra = to_device(self.multimodal_inputs(packages, encoded["input_ids"]), self.device) if packages else {}
            prompt_len = encoded["input_ids"].shape[1]
            processors = [logits_processor] if logits_processor is not None else []
            # Only when some row asks for it: greedy rows without penalties keep the plain path.
            if any(r.sampling.non_default() for r in requests):
                processors.append(SamplingProcessor([r.sampling for r in requests], prompt_len, self.device))
            criteria = []
            stops = None
            if streamer is not None:
                criteria.append(_StreamerStopped(streamer))
            elif any(r.sampling.stop for r in requests):
                stops = StopStrings(decode, [r.sampling.stop for r in requests], prompt_len)
                criteria.append(stops)
            cancel = CancelOnEvent(stop_event) if stop_event is not None else None
            if cancel is not None:
                criteria.append(cancel)
            output = self.model.generate(
                input_ids=encoded["input_ids"],
                attention_mask=encoded["attention_mask"],
                **extra,
                do_sample=False,
                num_beams=1,
                max_new_tokens=max(max_new_tokens),
                pad_token_id=pad_id,
                eos_token_id=eos_ids or None,
                output_logits=return_logits,
                return_dict_in_generate=True,
                logits_processor=LogitsProcessorList(processors) if processors else None,
                stopping_criteria=StoppingCriteriaList(criteria) if criteria else None,
                streamer=streamer,
            )
        lm_ms = (time.perf_counter() - began) * 1000
        results = []
        for b, limit in enumerate(max_new_tokens):
            new = output.sequences[b, prompt_len:].tolist()[:limit]
            finish = "length" if len(new) >= limit else "stop"
            # A finished row is padded with pad tokens after its EOS: keep up to and including EOS.
            for k, token in enumerate(new):
                if token in eos_ids:
                    new, finish = new[: k + 1], "stop"
                    break
            text = decode(new)
            tracker = streamer.tracker if streamer is not None else (stops.trackers[b] if stops is not None else None)
            if tracker is not None and tracker.stop:
                # The stop string and what follows it are not part of the answer.
                if tracker.update(text) or tracker.stopped:
                    text, finish = tracker.text, "stop"
            if cancel is not None and cancel.cancelled:
                finish = "cancelled"
            logits = None
            if return_logits:
                logits = torch.stack([step[b] for step in output.logits[: len(new)]]).float().cpu()
            results.append({
                "tokens": new, "logits": logits, "text": text, "finish_reason": finish,
                "prompt_tokens": int(encoded["attention_mask"][b].sum()),
                "prefix_tokens_reused": plan.reused_tokens(b) if plan is not None else 0,
                "prefix_ms": {"prefix_build": plan.build_ms, "prefix_load": plan.load_ms} if plan is not None else {},
            })
        return results, lm_ms

    def _finish(
        self, out: dict[str, Any], lm_ms: float, encode_ms: float, row: list[Any], request: GenerationRequest
    ) -> Generation:
        return Generation(
            text=out["text"],
            token_ids=out["tokens"],
            model=self.name,
            random_weights=self.random_weights,
            logits=out["logits"],
            timings_ms={
                "encode": encode_ms, "generate": lm_ms, "total": encode_ms + lm_ms,
                **out.get("prefix_ms", {}),
            },
            prompt_tokens=out["prompt_tokens"],
            image_tokens=[self.image_token_count(s) for s in row if isinstance(s, VisualPackage)],
            finish_reason=out["finish_reason"],
            prefix_tokens_reused=out.get("prefix_tokens_reused", 0),
        )

    # ----------------------------------------------------------------- scoring

    def answer_token_ids(self, yes: str = "yes", no: str = "no") -> tuple[int, int]:
        """The token ids whose logits stand for "yes" and "no" at the answer position.

        Real Qwen and SmolVLM tokenizers hold each word as one token; a tokenizer that
        splits a word (the tiny models' trained one splits "no") is represented by the
        word's first token, which is what greedy decoding would have to emit first.
        """
        ids = [self.tokenizer.encode(word, add_special_tokens=False) for word in (yes, no)]
        if not ids[0] or not ids[1] or ids[0][0] == ids[1][0]:
            raise BackendError(self.name, f"the tokenizer cannot tell {yes!r} from {no!r} by their first token")
        return ids[0][0], ids[1][0]

    def score_yes_no(self, requests: Sequence[GenerationRequest]) -> list[float]:
        """P("yes") per request: ONE forward pass over the whole batch, no decoding.

        The prompt of each request (references as packages, fresh images encoded first,
        exactly as :meth:`generate` does) is left-padded, so every row's answer position is
        the last one; the score is the softmax over that position's "yes"/"no" logits.
        Cached packages take the same ``mm_encoder_outputs`` seam as generation.
        """
        import torch

        requests = list(requests)
        rows, _, _ = self._package_rows(requests)
        yes_id, no_id = self.answer_token_ids()
        texts = [self.build_prompt(row) for row in rows]
        packages = [s for row in rows for s in row if isinstance(s, VisualPackage)]
        with runtime_errors(
            self.name, GenerationError, "scoring failed", device=self.device, dtype=self.dtype_name
        ), torch.inference_mode():
            self.tokenizer.padding_side = "left"
            encoded = self.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
            encoded = {k: to_device(v, self.device) for k, v in encoded.items()}
            extra = to_device(self.multimodal_inputs(packages, encoded["input_ids"]), self.device) if packages else {}
            output = self.model(
                input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"], **extra, use_cache=False
            )
            pair = output.logits[:, -1, [yes_id, no_id]].float()
            scores = torch.softmax(pair, dim=-1)[:, 0]
        return [float(s) for s in scores.cpu()]

    def close(self) -> None:
        """Drop the model and processors so their memory can be freed."""
        self.model = None


class _StreamerStopped:
    """Stopping criterion: the streamer saw a stop string (it decodes anyway, so it decides)."""

    def __init__(self, streamer: Any) -> None:
        self.streamer = streamer

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        return torch.full((input_ids.shape[0],), self.streamer.stopped, dtype=torch.bool, device=input_ids.device)


def _read_marker(source: str) -> dict[str, Any]:
    path = Path(source) / MARKER_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
