"""Shared logic of the Hugging Face transformers backends.

:class:`HFBackend` does everything that is the same for every model family: loading
through ``from_pretrained`` (hub id or local directory; :mod:`.loading`) on the chosen
device, dtype and attention implementation; the revision (a hub commit, or the content
hash of a local checkpoint: :mod:`.revision`); the fingerprint (:mod:`.fingerprint`);
batched encoding; and the template's core, :meth:`HFBackend.execute` and
:meth:`HFBackend.score` (:mod:`.generation`: greedy by default; sampling, stop strings,
streaming and cancellation through :mod:`.decoding`), through transformers' seam for
precomputed features (``mm_encoder_outputs``), so a cached reference runs no vision tower
and no image processor. Fresh images are encoded first with :meth:`HFBackend.encode` (the
references' code) by the base class's prepare step. The one subclass,
:class:`~.generic.GenericBackend`, knows the package contents, the placeholder layout and
the chat template of every family through transformers' processor and the family's traits.

Packages are always stored on the CPU; their tensors move to the model's device
when a prompt uses them. Runtime exceptions become refsight errors in one place,
:func:`~.runtime.runtime_errors` (out-of-memory named as such, with dtype and device).
"""

from __future__ import annotations

import abc
import functools
import importlib.util
import time
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

from ...errors import BackendError, InvalidInputError
from ...inputs.images import ImageInput
from ...package import EncoderFingerprint, VisualPackage
from ..base import Backend, Execution, Generation, PreparedRequest
from ...sampling import OUTPUT_FIELDS, SAMPLING_FIELDS, WINDOW_FIELDS
from ...requests import PROMPT_ENDS, GenerationRequest
from ..turns import split_final_turn
from .loading import MARKER_FILE, refuse_other_backend_options
from .revision import directory_revision
from .runtime import runtime_errors

__all__ = ["HFBackend", "runtime_errors", "weights_revision", "refuse_other_backend_options", "MARKER_FILE"]

#: Texts up to this many characters have their token count remembered (an image placeholder of a few
#: thousand tokens included); :data:`COUNTED_TEXTS` of them, the least recently used forgotten first
#: (at most ~4 MB of text kept).
COUNTED_TEXT_CHARS = 16384
COUNTED_TEXTS = 256

#: The revision of a local checkpoint directory (kept under its old name).
weights_revision = directory_revision


def _constrained_available() -> bool:
    try:
        return importlib.util.find_spec("refsight.backends.hf.constrained") is not None
    except (ImportError, ValueError):
        return False


class HFBackend(Backend):
    """A transformers VLM behind refsight: what every family shares; :class:`~.generic.GenericBackend`, the one
    subclass, adds what a family's processor and traits say.

    Construct through :func:`refsight.backends.hf.load_hf_backend` (or
    :meth:`from_pretrained`), not directly.
    """

    # The model's own log probabilities; the sampler chain's (post_sampling_probs) are llama.cpp's alone.
    sampling_fields: ClassVar[frozenset[str]] = frozenset((*SAMPLING_FIELDS, *WINDOW_FIELDS, *OUTPUT_FIELDS)) - {
        "post_sampling_probs"}
    supports_raw_prompt: ClassVar[bool] = True
    supports_turns: ClassVar[bool] = True
    supports_streaming: ClassVar[bool] = True
    #: Chats end as asked (a continued final assistant turn: llama-server's prefill); a streamed answer's prompt
    #: is reported as generate starts and as its first token comes (the prompt's evaluation is behind it).
    prompt_ends: ClassVar[frozenset[str]] = frozenset(PROMPT_ENDS)
    renders_template_variables: ClassVar[bool] = True
    supports_prompt_progress: ClassVar[bool] = True
    #: Tools render in the checkpoint's template as ``apply_chat_template(tools=...)`` renders them.
    supports_tools: ClassVar[bool] = True
    #: Short family name, part of the fingerprint ("qwen2_vl", "qwen3_vl", "smolvlm").
    family: ClassVar[str] = ""
    #: ``config.model_type`` values this family serves.
    model_types: ClassVar[tuple[str, ...]] = ()
    #: The family's ``*ForConditionalGeneration`` class, by its name in ``transformers``.
    model_class_name: ClassVar[str] = ""
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
        local_dir: str | None = None,
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
        #: The checkpoint's directory (None: loaded from the hub, where a branch may move).
        self.local_dir = local_dir
        self.supports_constrained_decoding = _constrained_available()
        # Batches are padded on the left so every row's last token is at the same position.
        self.tokenizer.padding_side = "left"
        # Computed now, from the settings as loaded: later changes to the processor
        # object (or test instrumentation on it) must not change what keys mean.
        from .fingerprint import hf_fingerprint

        self._fingerprint: EncoderFingerprint = hf_fingerprint(self)

    @abc.abstractmethod
    def chat_template_reads(self, variable: str) -> bool:
        """Whether the checkpoint's chat template mentions ``variable``."""

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """The tokenizer's ids of ``text`` (``parse_special=False``: special tokens' text split as plain text)."""
        with runtime_errors(self.name, BackendError, "cannot tokenize"):
            return list(self.tokenizer(text, add_special_tokens=add_special, split_special_tokens=not parse_special)["input_ids"])

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The tokenizer's text of ``tokens``, special tokens included."""
        tokens = self.check_token_ids(tokens, len(self.tokenizer))
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    def token_piece(self, token: int) -> bytes:
        """One token's text as UTF-8 bytes."""
        return self.detokenize([token]).encode("utf-8", "surrogatepass")

    def raw_text(self, segments: Sequence[str | VisualPackage]) -> str:
        """A raw prompt's text: the segments as given, each package its expanded placeholder."""
        return "".join(s if isinstance(s, str) else self.image_placeholder(s) for s in segments)

    def prompt_of(self, segments: Sequence[str | VisualPackage], request: GenerationRequest) -> str:
        """The whole prompt text of ``request`` (its ``segments`` prepared): raw, or the chat template over its
        turns ended as ``prompt_end`` asks (``continue``: the earlier turns with the opening of the answer's turn,
        then the final turn's text, as llama-server renders a prefill)."""
        if request.raw_prompt:
            return self.raw_text(segments)
        tools, variables = request.chat_tools, request.template_variables
        if request.prompt_end == "continue":
            head, head_turns, tail = split_final_turn(segments, request.turns or [])
            return self.build_prompt(head, head_turns, tools=tools, variables=variables) + tail
        return self.build_prompt(segments, request.turns, request.prompt_end == "generation_prompt", tools=tools,
                                 variables=variables)

    def count_text_tokens(self, text: str) -> int:
        """The exact number of tokens the model's tokenizer makes of ``text`` (no special tokens added).

        Texts up to :data:`COUNTED_TEXT_CHARS` long are remembered (the last :data:`COUNTED_TEXTS`): a request's
        text is counted by the server's prompt limit and again by the engine's prompt budget, an image's
        placeholder at every check, and clients send the same prompts again and again.
        """
        if len(text) > COUNTED_TEXT_CHARS:
            return self._count_tokens(text)
        counts = self.__dict__.get("_remembered_counts")
        if counts is None:  # made on first use: subclasses build their instances in many ways
            counts = self.__dict__.setdefault("_remembered_counts", functools.lru_cache(COUNTED_TEXTS)(self._count_tokens))
        return counts(text)

    def _count_tokens(self, text: str) -> int:
        with runtime_errors(self.name, BackendError, "cannot tokenize"):
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(cls, name: str, source: str, config: Any, **options: Any) -> "HFBackend":
        """Load model, tokenizer and image processor from ``source`` (hub id or directory).

        Takes every :class:`~refsight.backends.options.BackendOptions` field except the
        other runtimes' ``mmproj`` / ``encoder`` (refused by name), plus ``model_id``,
        ``random_weights`` and the family's :attr:`processor_options`. Options are checked
        and the image processor is built and tried before the (possibly slow) weight load
        (:func:`~.loading.load_parts`).
        """
        from .loading import load_parts

        parts = load_parts(cls, name, source, config, **options)
        return cls(name, **vars(parts))

    @classmethod
    def model_class(cls) -> Any:
        """The transformers ``*ForConditionalGeneration`` class of this family (:attr:`model_class_name`)."""
        import transformers

        return getattr(transformers, cls.model_class_name)

    @classmethod
    @abc.abstractmethod
    def image_processor_class(cls) -> Any:
        """The PIL image processor class of this family (no torchvision needed)."""

    @classmethod
    @abc.abstractmethod
    def processor_overrides(cls, options: dict[str, Any], processor: Any) -> dict[str, Any]:
        """Image-processor settings from the load options (``min_pixels`` ...), given the checkpoint's processor."""

    # -------------------------------------------------------------- fingerprint

    def fingerprint(self) -> EncoderFingerprint:
        """Backend, model id, revision, dtype, processor class and settings, attention and vision-merge settings."""
        return self._fingerprint

    def fingerprint_sources(self) -> list[Path] | None:
        """The checkpoint directory and the files its revision hashes; None for a hub model (a branch moves)."""
        if self.local_dir is None:
            return None
        from .revision import content_files

        return [Path(self.local_dir), *content_files(self.local_dir)]

    def attn_implementation(self) -> dict[str, str]:
        """The attention kernels in use, per (sub-)config: they change features beyond rounding."""
        from .fingerprint import attn_implementation

        return attn_implementation(self.model)

    def model_settings(self) -> dict[str, Any]:
        """Model-side settings that shape the features (merge size, deepstack layers ...)."""
        return {}

    # ------------------------------------------------------------------- encode

    @property
    def weights(self) -> dict[str, Any]:
        """The checkpoint's parameters, counted, and its dtype in GGUF's words (``F32``, ``BF16``)."""
        count = sum(p.numel() for p in self.model.parameters())
        short = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
        return {"parameter_count": count, "quantization": short.get(self.dtype_name, self.dtype_name.upper())}

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
                raise InvalidInputError(f"images[{i}]", f"expected an ImageInput (use refsight.inputs.images.load_image), got {type(image).__name__}")
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

    def build_prompt(
        self, segments: Sequence[str | VisualPackage], turns: list[tuple[str, int]] | None = None,
        generation_prompt: bool = True, tools: Any = None, variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The full prompt text of one request whose images are all packages by now.

        Without ``turns`` it is one user turn, exactly as :meth:`chat_prompt` renders it; this default always
        opens the answer's turn and renders no tools and reads no template variables (a family that renders its
        template itself takes ``generation_prompt=False``, ``tools`` and ``variables``).
        """
        if tools is not None:
            raise InvalidInputError("tools", f"{self.family or self.name} renders no tools")
        if variables:
            raise InvalidInputError("template_variables", f"{self.family or self.name} renders no chat template of its own")
        if not generation_prompt:
            raise InvalidInputError("prompt_end", f"{self.family or self.name} always opens the answer's turn")
        parts = [s if isinstance(s, str) else self.image_placeholder(s) for s in segments]
        if turns is None:
            return self.chat_prompt(parts)
        split, start = [], 0
        for role, count in turns:
            split.append((role, parts[start:start + count]))
            start += count
        return self.chat_prompt_turns(split)

    @property
    def image_token_ids(self) -> frozenset[int]:
        """The token ids that stand for image features in a prompt (the config's image token)."""
        return frozenset({int(self.model.config.image_token_id)})

    def image_token_count(self, package: VisualPackage | ImageInput) -> int | None:
        """Prompt tokens one image takes: a package's placeholder, tokenized (pixels: None, the family's layout
        decides after encoding)."""
        if not isinstance(package, VisualPackage):
            return None
        return self.count_text_tokens(self.image_placeholder(package))

    @abc.abstractmethod
    def multimodal_inputs(self, packages: list[VisualPackage], input_ids: Any) -> dict[str, Any]:
        """Keyword arguments for ``generate``: ``mm_encoder_outputs`` and the family's extras."""

    # ------------------------------------------------------- the template's core

    def encodes_fresh_images(self, request: GenerationRequest) -> bool:
        """Always: a fresh image takes the references' own encode and the same ``mm_encoder_outputs`` seam."""
        return True

    def execute(self, batch: list[PreparedRequest], execution: Execution) -> list[Generation]:
        """One ``model.generate`` call over the batch (:func:`~.generation.generate_batch`); cached packages
        skip the vision tower; constrained and free rows share the batch."""
        from .generation import generate_batch

        return generate_batch(self, batch, execution)

    def score(self, batch: list[PreparedRequest]) -> list[float]:
        """P("yes") per request: one forward pass over the whole batch (:func:`~.generation.score_batch`)."""
        from .generation import score_batch

        return score_batch(self, batch)

    def compile_schema(self, schema: dict[str, Any]) -> Any:
        """The schema's xgrammar grammar for this tokenizer (compiled once, cached; see :mod:`.constrained`)."""
        from . import constrained  # lazy: only requests with a schema pay for it

        return constrained.compile_json_grammar(self.tokenizer, schema, self.vocab_size, stop_token_ids=self.eos_ids() or None)

    def json_constraint(self, grammars: list[Any]) -> Any:
        """A fresh logits processor constraining each row to its compiled grammar (None: a free row)."""
        from . import constrained

        return constrained.json_logits_processor(self.tokenizer, grammars, self.vocab_size, stop_token_ids=self.eos_ids() or None)

    @property
    def vocab_size(self) -> int:
        """Rows of the language model's output layer (the logits' width)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    def eos_ids(self) -> list[int]:
        """The token ids generation stops at (the generation config's, else the tokenizer's)."""
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]

    def pad_id(self) -> int:
        """The padding token id (the tokenizer's, else the first EOS)."""
        if self.tokenizer.pad_token_id is not None:
            return int(self.tokenizer.pad_token_id)
        return (self.eos_ids() or [0])[0]

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

    def close(self) -> None:
        """Drop the model and processors so their memory can be freed."""
        self.model = None
