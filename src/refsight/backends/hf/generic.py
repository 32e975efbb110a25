"""One transformers backend for every VLM family with the precomputed-features seam.

transformers 5 gives each VLM the same two doors: ``get_image_features(pixel_values, ..., return_dict=True)`` runs
the vision tower and projector, and ``mm_encoder_outputs={"image": ...}`` feeds such an output back in place of
pixels (``generate`` itself uses this pair). The processor classes share one pipeline too: ``_process_images`` runs
the image processor and asks ``replace_image_token`` for each image's expanded placeholder text.

:class:`GenericBackend` therefore needs no family code. A package holds what
``get_image_features`` returned for one image (``features``, or ``features.0`` ... when the
output is a list of per-tile tensors) and, as metadata, what the processor derived from the
pixels: the expanded ``placeholder`` text and the processor's other outputs (``image_sizes``, ``num_patches``,
``image_grid_thw`` ... under ``layout``). A prompt is the checkpoint's own
chat template rendered by the processor (tools included), each image token replaced by its package's placeholder,
exactly as the processor would; the prompt-time extras the processor adds (``token_type_ids`` for Gemma 3 and
PaliGemma, ``mm_token_type_ids`` for the M-RoPE families) are rebuilt from the token ids. Per-family exceptions
are data (:mod:`refsight.families`).
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any, ClassVar, Mapping, Sequence

from ...errors import BackendError, CorruptPackageError, InvalidInputError, ModelLoadError
from ...families.entry import Traits
from ...inputs.images import ImageInput
from ...package import VisualPackage
from ...requests import GenerationRequest
from .base import HFBackend
from .chat import chat_messages, render_chat
from .classes import family_classes, seam_problem, traits_for
from .encoder_outputs import MAIN, join, pack, split, tensor_names
from .fingerprint import jsonable
from .load_options import mapping_for

__all__ = ["GenericBackend", "generic_family"]

#: The prompt-time token type inputs a processor may emit, rebuilt from the token ids.
TOKEN_TYPE_KEYS = ("token_type_ids", "mm_token_type_ids")
# Processor outputs that are the prompt itself, not per-image layout (nor is anything about the
# pixels, ``pixel_*``: SmolVLM's per-pixel attention mask would make the metadata the image's size).
_NOT_LAYOUT = {"input_ids", "attention_mask", *TOKEN_TYPE_KEYS}


class GenericBackend(HFBackend):
    """A transformers VLM served through the seam alone; :func:`generic_family` makes one class per model type."""

    traits: ClassVar[Traits] = Traits()
    #: The family's processor class name in ``transformers``.
    processor_class_name: ClassVar[str] = ""
    #: The family's PIL image processor class name in ``transformers``.
    image_processor_name: ClassVar[str] = ""

    def __init__(self, name: str, *, processor: Any, **parts: Any) -> None:
        fit = mapping_for(self.traits.options).fit
        if fit is not None:  # before the fingerprint, which holds the processor's settings
            fit(processor, parts["model"].config)
        self.processor = processor
        self.image_token = str(processor.image_token)
        super().__init__(name, **parts)
        self.reserved_tokens = tuple(dict.fromkeys([self.image_token, *self.tokenizer.all_special_tokens]))
        self.media_tokens = tuple(dict.fromkeys([self.image_token, *processor.all_special_multimodal_tokens]))
        merged = processor._merge_kwargs(tokenizer_init_kwargs=self.tokenizer.init_kwargs, return_tensors="pt", **self.traits.layout)
        # With the processor's own settings its _process_images takes by name (LFM2-VL's use_image_special_tokens).
        named = [k for k, p in inspect.signature(processor._process_images).parameters.items() if p.kind != p.VAR_KEYWORD]
        self._images_kwargs = {**merged["images_kwargs"], **{k: merged[k] for k in named if k in merged}}
        # The base model's encoder, as generate calls it (a family's top-level wrapper may take only *args, or, as
        # DeepSeek-VL's and Janus', have none).
        self._encoder = getattr(self.model.base_model, "get_image_features", None) or self.model.get_image_features
        self._feature_params = set(inspect.signature(self._encoder).parameters)
        # Per-image layout the language model's forward takes beside the features (never the pixels).
        self._forward_layout = {
            k for k in inspect.signature(self.model.forward).parameters if not _is_pixels(k) and k not in _NOT_LAYOUT
        }
        self._token_type_key, self._token_types_mark_images = self._probe_token_types()
        use_image_id = getattr(processor, "use_image_id", None)
        self._numbers_images = hasattr(processor, "_prepend_local_ids") and bool(
            getattr(processor, "default_use_image_id", False) if use_image_id is None else use_image_id
        )

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(cls, name: str, source: str, config: Any, **options: Any) -> "GenericBackend":
        """Load model, tokenizer and PIL image processor (:func:`~.loading.load_parts`), then the image-only processor."""
        from .classes import processor_class
        from .loading import load_parts
        from .processor import image_only_processor

        parts = load_parts(cls, name, source, config, **options)
        hub = {} if os.path.isdir(source) else {"revision": parts.revision}
        processor = image_only_processor(
            processor_class(cls.processor_class_name), source, parts.image_processor, parts.tokenizer, hub, name
        )
        return cls(name, processor=processor, **vars(parts))

    @classmethod
    def image_processor_class(cls) -> Any:
        """The family's PIL image processor class (transformers' auto table names it, or the family's traits)."""
        from .classes import image_processor_class

        return image_processor_class(cls.image_processor_name)

    @classmethod
    def processor_overrides(cls, options: dict[str, Any], processor: Any) -> dict[str, Any]:
        """Image-processor settings from the load options, through the family's mapping (:mod:`.load_options`)."""
        return mapping_for(cls.traits.options).apply(options, processor, cls.family)

    def _probe_token_types(self) -> tuple[str | None, bool]:
        """Which token type input the processor emits beside the ids, and whether it marks the image
        tokens (Gemma 3's ``token_type_ids``, the M-RoPE families' ``mm_token_type_ids``) or is all
        zeros (PaliGemma's, the tokenizer's own); (None, False) when it emits none."""
        import torch
        from PIL import Image

        probe = self.processor(
            text=[f"a {self.image_token} b"], images=[Image.new("RGB", (64, 48), (120, 80, 40))], return_tensors="pt"
        )
        key = next((k for k in TOKEN_TYPE_KEYS if k in probe), None)
        if key is None:
            return None, False
        marks = self._image_mask(probe["input_ids"])
        if torch.equal(probe[key].to(torch.long), marks):
            return key, True
        if not probe[key].any():
            return key, False
        raise ModelLoadError(self.name, f"{type(self.processor).__name__} emits {key} refsight cannot rebuild from the ids")

    def _image_mask(self, input_ids: Any) -> Any:
        import torch

        image_ids = torch.tensor(sorted(self.image_token_ids), dtype=input_ids.dtype, device=input_ids.device)
        return torch.isin(input_ids, image_ids).to(torch.long)

    def model_settings(self) -> dict[str, Any]:
        """The processor's own settings (token counts per image, feature strategy ...) and the layout switches."""
        own = {"image_processor", "tokenizer", "chat_template", "processor_class", "auto_map"}
        settings = {k: v for k, v in self.processor.to_dict().items() if k not in own and not k.endswith("_processor")}
        traits = {"layout": self.traits.layout, "features": self.traits.features, "multi_image": self.traits.multi_image}
        return {"processor": jsonable(settings), **jsonable(traits)}

    def chat_template_reads(self, variable: str) -> bool:
        """Whether the checkpoint's chat template mentions ``variable``."""
        return variable in (self.processor.chat_template or "")

    def chat_template_source(self) -> str | None:
        """The checkpoint's chat template (Jinja) as its processor holds it: what chats are rendered in."""
        return self.processor.chat_template

    def use_chat_template(self, template: str) -> None:
        """Render chats in ``template`` instead of the checkpoint's (the processor holds it: every rendering reads it),
        once it passes :meth:`probe_chat_template`."""
        previous, self.processor.chat_template = self.processor.chat_template, template
        try:
            self.probe_chat_template()
        except BaseException:
            self.processor.chat_template = previous
            raise

    # ------------------------------------------------------------------- encode

    def encode_pils(self, images: list[Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Each image's features and placeholder, as the processor lays it out: a batch in one tower call
        where the family's processor lays images out independently (:attr:`~refsight.families.entry.Traits.batch`),
        else one image per call."""
        groups = [images] if self.traits.batch else [[image] for image in images]
        return [encoded for group in groups for encoded in self._encode_group(group)]

    def _encode_group(self, images: list[Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        processed, placeholders = self.lay_out(images)
        output = self._run_encoder(processed)
        if len(images) == 1:
            return [self._package(output, processed, placeholders[0])]
        outputs = split(output, self.traits.features, len(images))
        layouts = [{k: v[i : i + 1] for k, v in processed.items()} for i in range(len(images))]
        return [self._package(*parts) for parts in zip(outputs, layouts, placeholders)]

    def lay_out(self, images: list[Any]) -> tuple[Any, list[str]]:
        """The processor's outputs for ``images`` and each one's expanded placeholder text (the one place
        pixels meet the image processor: a cached reference never comes here)."""
        if self.traits.multi_image:
            return self._process_in_multi_image_mode(images[0])
        return self.processor._process_images(images, **self._images_kwargs)

    def _run_encoder(self, processed: Any) -> Any:
        inputs = {k: v for k, v in processed.items() if k in self._feature_params}
        inputs = {k: _to(v, self.device, self.model.dtype) for k, v in inputs.items()}
        return self._encoder(**inputs, return_dict=True)

    def _package(self, output: Any, processed: Any, placeholder: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """One image's tensors and metadata; ``processed``: the processor's outputs for it alone."""
        tensors, structure = pack(output, self.traits.features)
        layout = {k: jsonable(_plain(v)) for k, v in processed.items() if not _is_pixels(k) and k not in _NOT_LAYOUT}
        metadata = {
            "placeholder": placeholder,
            "num_tokens": self._image_token_count(placeholder),
            "feature_rows": _rows(t for n, t in tensors.items() if n.split(".")[0] == MAIN),
            "structure": structure,
            "layout": layout,
        }
        return tensors, metadata

    def _process_in_multi_image_mode(self, image: Any) -> tuple[Any, list[str]]:
        """One image laid out as inside a prompt of several (``batch_num_images`` = 2, which the image
        processor would otherwise derive from how the images of a call are nested)."""
        image_processor = self.image_processor
        kwargs = {k: v for k, v in self._images_kwargs.items() if k != "batch_num_images"}
        processed = super(type(image_processor), image_processor).preprocess([image], [2], **kwargs)
        return processed, [self.processor.replace_image_token(processed, image_idx=0, **kwargs)]

    @property
    def image_token_ids(self) -> frozenset[int]:
        """The token ids the processor marks as image tokens (those the features replace)."""
        ids = frozenset(int(i) for i in self.processor.image_token_ids if i is not None)
        # Janus' processor names its image token but keeps no id for it: the tokenizer's is the one it writes.
        return ids or frozenset([int(self.tokenizer.convert_tokens_to_ids(self.image_token))])

    def image_token_count(self, package: VisualPackage | ImageInput) -> int | None:
        """Prompt tokens one image takes: a package's placeholder, tokenized; pixels only where the family's
        grid counts them from their size (Qwen), else None (the layout decides once they are encoded)."""
        if isinstance(package, ImageInput):
            if not self.traits.grid:
                return None
            from .grid import grid_tokens

            return grid_tokens(self, *package.size)  # from the size alone: released pixels are not decoded again
        return super().image_token_count(package)

    def _image_token_count(self, text: str) -> int:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return sum(1 for i in ids if i in self.image_token_ids)

    def check_package(self, package: VisualPackage) -> None:
        """Placeholder, feature tensors and their row count agree with the metadata."""
        meta = package.metadata
        main = _main_tensors(package)
        rows = _rows(main)
        if rows != int(meta.get("feature_rows", -1)):
            raise CorruptPackageError(package.key, f"features hold {rows} rows, metadata says {meta.get('feature_rows')}")
        if self.traits.grid:
            from .grid import grid_problem

            problem = grid_problem(self, meta)
            if problem:
                raise CorruptPackageError(package.key, problem)
        width = {int(t.shape[-1]) for t in main}
        if width != {self.feature_width}:
            raise CorruptPackageError(package.key, f"feature width {sorted(width)}, the model takes {self.feature_width}")

    @property
    def feature_width(self) -> int:
        """Width of a feature row: the language model's hidden size."""
        return int(self.model.get_input_embeddings().weight.shape[1])

    # ----------------------------------------------------------------- prompts

    def image_placeholder(self, package: VisualPackage) -> str:
        """The placeholder text the processor wrote for this image when it was encoded."""
        return str(package.metadata["placeholder"])

    def build_prompt(
        self, segments: Sequence[str | VisualPackage], turns: list[tuple[str, int]] | None = None,
        generation_prompt: bool = True, tools: Any = None, variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The checkpoint's chat template over the turns (``generation_prompt``: the answer's turn opened; ``tools``: a
        :class:`~refsight.tools.ChatTools`; ``variables``: the template's own), each image token its placeholder."""
        packages = [s for s in segments if isinstance(s, VisualPackage)]
        text = self._render(list(segments), turns, generation_prompt, tools, variables)
        pieces = text.split(self.image_token)
        if len(pieces) != len(packages) + 1:
            raise BackendError(self.name, f"the chat template placed {len(pieces) - 1} image token(s) for "
                               f"{len(packages)} image(s)")
        placeholders = [self.image_placeholder(p) for p in packages]
        if self._numbers_images:
            # MiniCPM-V numbers the images of a prompt (<image_id>N</image_id>) outside the placeholder.
            placeholders = self.processor._prepend_local_ids([text], placeholders, self.image_token)
        return pieces[0] + "".join(placeholder + rest for placeholder, rest in zip(placeholders, pieces[1:]))

    def template_text(
        self, texts: Sequence[str], turns: list[tuple[str, int]] | None = None, *, generation_prompt: bool = True,
        tools: Any = None, variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The chat template around ``texts``, each media marker in them rendered as the template renders an
        image (Qwen: ``<|vision_start|>`` marker ``<|vision_end|>``), so ``/completion`` on the text is the chat
        prompt; ``generation_prompt=False``: without the opening of the answer's turn."""
        marker = self.media_marker
        pieces_per_text = [_with_images(text, marker) for text in texts]
        segments: list[Any] = []
        image_turns: list[tuple[str, int]] = []
        start = 0
        for role, count in turns or [("user", len(texts))]:
            parts = [part for pieces in pieces_per_text[start:start + count] for part in pieces] or [""]
            segments += parts
            image_turns.append((role, len(parts)))
            start += count
        return self._render(segments, image_turns, generation_prompt, tools, variables).replace(self.image_token, marker)

    def prompt_text_of(self, request: GenerationRequest) -> str:
        """The checkpoint's chat template over ``request``, each image as the media marker (:meth:`chat_text`); a raw
        prompt's text as given."""
        if request.raw_prompt:
            return super().prompt_text_of(request)
        texts = [s if isinstance(s, str) else self.media_marker for s in request.segments]
        return self.chat_text(texts, request.turns, request.prompt_end, request.chat_tools, request.template_variables)

    def _render(self, segments: list[Any], turns: list[tuple[str, int]] | None, generation_prompt: bool = True,
                tools: Any = None, variables: Mapping[str, Any] | None = None) -> str:
        """The template over text and image segments (anything not a string is an image): one image token
        per image, after the processor's own rewrite. The mixin's rendering (:mod:`.chat`; the few processors that
        override it, SmolVLM's, only add video arguments the image-only processor has no use for)."""
        try:
            text = render_chat(self.processor, chat_messages(segments, turns, tools), generation_prompt, tools, variables)
        except InvalidInputError:  # the bounded renderer's word on the template (a ValueError too)
            raise
        except ValueError as e:  # the processor has no template to render
            raise BackendError(self.name, f"the chat template cannot render this prompt: {e}") from e
        images = sum(1 for s in segments if not isinstance(s, str))
        return self._processor_layout(text, images) if images else text

    def _processor_layout(self, text: str, images: int) -> str:
        """The processor's own rewrite of a prompt's text before expansion (PaliGemma: ``<bos>`` after
        the last image, ``\\n`` at the end; most families: none)."""
        from PIL import Image

        stand_ins = [[Image.new("RGB", (1, 1))] * images]  # the hook looks at how many images, not at them
        _, texts, *_ = self.processor.prepare_inputs_layout(images=stand_ins, text=[text])
        return texts[0]

    def chat_prompt(self, parts: list[str]) -> str:
        """One user turn of text parts in the checkpoint's chat template."""
        return self.build_prompt(parts)

    def chat_prompt_turns(self, turns: list[tuple[str, list[str]]]) -> str:
        """Several turns of text parts in the checkpoint's chat template."""
        return self.build_prompt([p for _, parts in turns for p in parts], [(role, len(parts)) for role, parts in turns])

    def multimodal_inputs(self, packages: list[VisualPackage], input_ids: Any) -> dict[str, Any]:
        """The packages' outputs joined as one ``mm_encoder_outputs`` entry, the per-image layout the
        forward reads (GLM-4V's ``image_grid_thw`` for its rotary index), and the token types rebuilt."""
        import torch

        out: dict[str, Any] = {"mm_encoder_outputs": {"image": join(packages)}}
        for key in sorted(self._forward_layout & set(packages[0].metadata["layout"])):
            if all(key in p.metadata["layout"] for p in packages):
                rows = [row for p in packages for row in p.metadata["layout"][key]]
                out[key] = torch.tensor(rows, device=input_ids.device)
        if self._token_type_key is not None:
            marks = self._image_mask(input_ids)
            out[self._token_type_key] = marks if self._token_types_mark_images else torch.zeros_like(marks)
        return out


def _with_images(text: str, marker: str) -> list[Any]:
    """``text`` split at each media marker, an image stand-in (None) where each was; empty pieces dropped."""
    pieces = text.split(marker)
    out: list[Any] = [pieces[0]] if pieces[0] else []
    for piece in pieces[1:]:
        out.append(None)
        if piece:
            out.append(piece)
    return out


def _is_pixels(name: str) -> bool:
    # DeepSeek-VL-Hybrid's second tower takes high_res_pixel_values.
    return name.startswith("pixel_") or name.endswith("_pixel_values")


def _to(value: Any, device: str, dtype: Any) -> Any:
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    return value.to(device, dtype) if value.is_floating_point() else value.to(device)


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def _main_tensors(package: VisualPackage) -> list[Any]:
    """The package's main feature tensors, once its placeholder is there and its structure names tensors it holds."""
    meta, tensors = package.metadata, package.tensors
    if not isinstance(meta.get("placeholder"), str) or not meta["placeholder"]:
        raise CorruptPackageError(package.key, "no placeholder text for the image")
    try:
        names = tensor_names(meta["structure"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CorruptPackageError(package.key, f"unreadable feature structure: {type(e).__name__}: {e}") from None
    missing = [n for n in names if n not in tensors]
    if missing:
        raise CorruptPackageError(package.key, f"missing tensor(s) {', '.join(missing)}")
    return [tensors[n] for n in names if n.split(".")[0] == MAIN]


def _rows(tensors: Any) -> int:
    return sum(int(t.numel()) // max(1, int(t.shape[-1])) for t in tensors)


def generic_family(model_type: str, name: str = "") -> type[GenericBackend]:
    """The :class:`GenericBackend` subclass serving ``model_type``; :class:`ModelLoadError` when it cannot."""
    problem = seam_problem(model_type, family_classes(model_type))
    if problem:
        raise ModelLoadError(name or model_type, f"model type {model_type!r} cannot be served: {problem}")
    return _family_class(model_type)


@functools.cache
def _family_class(model_type: str) -> type[GenericBackend]:
    # One class per model type, made once: its name shows in errors and logs.
    classes = family_classes(model_type)
    title = "".join(part.title() for part in model_type.split("_"))
    return type(f"{title}Backend", (GenericBackend,), {
        "__doc__": f"{model_type} through transformers' seam (:class:`GenericBackend`).",
        "family": model_type,
        "model_types": (model_type,),
        "model_class_name": classes.model,
        "processor_class_name": classes.processor,
        "image_processor_name": classes.image_processor,
        "traits": traits_for(model_type),
        "processor_options": mapping_for(traits_for(model_type).options).names,
    })
