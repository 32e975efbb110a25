"""Built-in offline models: random weights from a fixed seed, real transformers code.

``tiny-*`` models are small (hidden 64, 2 layers) so tests run in seconds;
``tiny-<family>`` models of the families the generic backend serves are recipes in
:mod:`.family_checkpoints`; ``shape-*`` models have a real model's vision tower and projector at full size and
a reduced language model, so benchmarks measure real encode times. Each is built
once from a config, with a tokenizer trained in-process (see
:mod:`refsight.builtin_models.tokenizer`), saved with ``save_pretrained`` into the
model cache (``$REFSIGHT_MODEL_CACHE``, default ``<user cache>/refsight/models``)
and then loaded from there through the same ``from_pretrained`` path as a real
checkpoint. Every output they produce says ``random_weights=True``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..support.environment import model_cache_dir  # re-exported: the builders' cache lives there
from ..errors import ModelLoadError, UnknownModelError
from .shape_vocab import Vocabulary, shape_vocabulary
from .family_checkpoints import FAMILY_SPECS, SHAPE_FAMILY_SPECS, build_family_checkpoint
from .processor_files import write_processor_files

__all__ = [
    "TINY_MODELS", "ModelSpec", "MARKER_FILE", "model_cache_dir", "ensure_model_dir", "build_checkpoint", "build_into_cache",
    "qwen_spec", "smolvlm_spec",
]

#: Bump when a build recipe changes, so old cache entries are not reused.
BUILD_VERSION = 1
#: Bump when :func:`~.processor_files.write_processor_files` changes what it writes (tiny models only:
#: the GGUF builds start from :func:`build_checkpoint` and keep their keys).
PROCESSOR_FILES_VERSION = 1
SEED = 0
#: The file beside a built model that says what it is (random weights, its name, seed and build).
MARKER_FILE = "refsight_model.json"


@dataclass(frozen=True)
class _Spec:
    family: str  # "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "smolvlm"
    vision: dict[str, Any]
    text: dict[str, Any]
    processor: dict[str, Any]
    extra: dict[str, Any]
    #: "module:function" called as ``f(directory, tokenizer, spec)`` after the save, for
    #: files another runtime needs (vLLM: a chat template, a processor with a video part).
    finish: str | None = None
    #: The dtype the weights are built and saved in (None: float32, as before this field existed).
    save_dtype: str | None = None
    #: The tokenizer's vocabulary (None: the tiny models' 512 tokens; see :mod:`.shape_vocab`).
    vocabulary: Vocabulary | None = None


#: The language model of the tiny Qwen checkpoints (head dim 16; mrope sections sum to half of it),
#: shared by the transformers, llama.cpp and vLLM variants.
QWEN_TINY_TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
)

#: The public name of a build recipe (family, vision, text, processor settings).
ModelSpec = _Spec

#: The tiny vision towers of each Qwen family (the llama.cpp variants deepen them to 3 layers).
QWEN2_VISION = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14, spatial_merge_size=2)
QWEN25_VISION = dict(
    depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=14,
    spatial_merge_size=2, window_size=56, fullatt_block_indexes=[1],
)
QWEN3_VISION = dict(
    depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16,
    spatial_merge_size=2, num_position_embeddings=256, deepstack_visual_indexes=[0, 1],
)
#: Qwen2-VL-2B's vision tower and projector at full size.
QWEN2_2B_VISION = dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4, patch_size=14, spatial_merge_size=2)
QWEN_PROCESSOR = dict(min_pixels=28 * 28, max_pixels=112 * 112)
QWEN3_PROCESSOR = dict(patch_size=16, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3, min_pixels=32 * 32, max_pixels=128 * 128)
QWEN2_2B_PROCESSOR = dict(min_pixels=56 * 56, max_pixels=28 * 28 * 1280)
#: Qwen3-VL's interleaved multimodal rotary embedding over a head of ``2 * sum(sections)``.
QWEN3_ROPE = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [4, 2, 2], "mrope_interleaved": True}


def qwen_spec(family: str, vision: dict[str, Any], text: dict[str, Any] = QWEN_TINY_TEXT,
              processor: dict[str, Any] = QWEN_PROCESSOR, **fields: Any) -> _Spec:
    """A Qwen-family recipe (no extra config fields); ``fields``: ``finish``, ``save_dtype``."""
    return _Spec(family, vision=vision, text=text, processor=processor, extra={}, **fields)


def smolvlm_spec(vision: tuple[int, int, int, int, int, int], text: tuple[int, int, int, int, int, int],
                 *, longest_edge: int, tile: int, scale_factor: int, vocabulary: Vocabulary | None = None) -> _Spec:
    """A SmolVLM recipe: ``vision`` = (hidden, MLP, layers, heads, image size, patch), ``text`` = (hidden,
    MLP, layers, heads, KV heads, max positions) of its llama language model; ``vocabulary`` as in :class:`_Spec`."""
    v_hidden, v_mlp, v_layers, v_heads, image_size, patch = vision
    hidden, mlp, layers, heads, kv_heads, positions = text
    return _Spec(
        "smolvlm",
        vision=dict(hidden_size=v_hidden, intermediate_size=v_mlp, num_hidden_layers=v_layers, num_attention_heads=v_heads,
                    image_size=image_size, patch_size=patch),
        text=dict(model_type="llama", hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=positions),
        processor=dict(size={"longest_edge": longest_edge}, max_image_size={"longest_edge": tile}),
        extra=dict(scale_factor=scale_factor),
        vocabulary=vocabulary,
    )


TINY_MODELS: dict[str, _Spec] = {
    "tiny-qwen2-vl": qwen_spec("qwen2_vl", QWEN2_VISION),
    "tiny-qwen2.5-vl": qwen_spec("qwen2_5_vl", QWEN25_VISION),
    "tiny-qwen3-vl": qwen_spec("qwen3_vl", QWEN3_VISION, dict(QWEN_TINY_TEXT, head_dim=16, rope_parameters=QWEN3_ROPE), QWEN3_PROCESSOR),
    "tiny-smolvlm": smolvlm_spec((32, 64, 2, 2, 32, 8), (64, 128, 2, 4, 2, 4096), longest_edge=64, tile=32, scale_factor=2),
    # Qwen2-VL-2B's vision tower and projector at full size; a one-layer language model.
    "shape-qwen2-vl-2b": qwen_spec(
        "qwen2_vl", QWEN2_2B_VISION,
        dict(
            hidden_size=1536, intermediate_size=2048, num_hidden_layers=1, num_attention_heads=12, num_key_value_heads=2,
            max_position_embeddings=32768,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
        ),
        QWEN2_2B_PROCESSOR,
    ),
    # Qwen2-VL-2B's whole shape: the vision tower and projector above and the real 28-layer language
    # model (hidden 1536, MLP 8960, 12 heads, 2 KV heads, head dim 128), built and saved in bf16 (~4.4 GB),
    # so benchmarks see the language model's true share. The vocabulary is the built-in tokenizer's
    # (small), so only the embedding and LM-head matrices are smaller than the real model's.
    "shape-qwen2-vl-2b-full": qwen_spec(
        "qwen2_vl", QWEN2_2B_VISION,
        dict(
            hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
            max_position_embeddings=32768, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
        ),
        QWEN2_2B_PROCESSOR,
        save_dtype="bfloat16",
    ),
    # SmolVLM-256M's SigLIP tower (93M) and connector at full size; a one-layer language model and a
    # vocabulary of a few thousand tokens, so a verdict is a few dozen decode steps, not ~360.
    "shape-smolvlm-256m": smolvlm_spec(
        (768, 3072, 12, 12, 512, 16), (576, 1536, 1, 9, 3, 8192), longest_edge=2048, tile=512, scale_factor=4,
        vocabulary=shape_vocabulary(),
    ),
}


def _build_id(name: str) -> str:
    import transformers

    if name in FAMILY_SPECS or name in SHAPE_FAMILY_SPECS:
        family = FAMILY_SPECS.get(name) or SHAPE_FAMILY_SPECS[name]
        recipe = json.dumps({"family_spec": family.recipe(), "seed": SEED, "build": BUILD_VERSION,
                             "transformers": transformers.__version__}, sort_keys=True, default=str)
        return hashlib.sha256(recipe.encode()).hexdigest()[:12]
    # A spec without a finish hook (or dtype, or vocabulary) hashes as before the field existed (same cache entries).
    spec = {k: v for k, v in TINY_MODELS[name].__dict__.items() if k not in ("finish", "save_dtype", "vocabulary") or v}
    if "vocabulary" in spec:
        spec["vocabulary"] = spec["vocabulary"].fingerprint()
    fields: dict[str, Any] = {"spec": spec, "seed": SEED, "build": BUILD_VERSION, "transformers": transformers.__version__}
    if not TINY_MODELS[name].finish:
        # Builds from before the processor files (chat template, processor settings) are other entries.
        fields["processor_files"] = PROCESSOR_FILES_VERSION
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:12]


def build_into_cache(name: str, build_id: str, done: str, build: Callable[[Path], None], what: str) -> Path:
    """``<model cache>/<name>-<build_id>``, built by ``build(directory)`` unless its file ``done`` is there.

    The build goes into a temporary directory beside the target and is renamed into place,
    so a reader never sees half a model; a file lock keeps two processes from building the
    same (possibly large) model twice. A failure is a :class:`ModelLoadError` naming ``what``.
    """
    from filelock import FileLock

    root = model_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{name}-{build_id}"
    if (target / done).is_file():
        return target
    with FileLock(str(root / f"{name}.lock")):
        if (target / done).is_file():  # another process finished while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        try:
            build(tmp)
            try:
                os.rename(tmp, target)
            except OSError:
                # Someone without the lock (another cache user) got there first: theirs is as good.
                if not (target / done).is_file():
                    raise
        except ModelLoadError:
            raise
        except Exception as e:
            raise ModelLoadError(name, f"cannot build {what} in {root}: {type(e).__name__}: {e}") from e
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def ensure_model_dir(name: str) -> Path:
    """Build ``name`` into the cache unless it is there already; return its directory (:func:`build_into_cache`)."""
    if name not in TINY_MODELS and name not in FAMILY_SPECS and name not in SHAPE_FAMILY_SPECS:
        raise UnknownModelError(name, [*TINY_MODELS, *FAMILY_SPECS, *SHAPE_FAMILY_SPECS])
    return build_into_cache(name, _build_id(name), "config.json", lambda tmp: _build(name, tmp), "the built-in model")


def _build(name: str, directory: Path) -> None:
    if name in FAMILY_SPECS or name in SHAPE_FAMILY_SPECS:
        build_family_checkpoint(FAMILY_SPECS.get(name) or SHAPE_FAMILY_SPECS[name], directory, seed=SEED)
        _write_marker(directory, name)
        return
    spec = TINY_MODELS[name]
    build_checkpoint(name, spec, directory)
    if not spec.finish:  # a finish hook writes its runtime's own files
        write_processor_files(directory, spec)


def _write_marker(directory: Path, name: str) -> None:
    (directory / MARKER_FILE).write_text(
        json.dumps({"random_weights": True, "model_id": f"refsight/{name}", "seed": SEED, "build": BUILD_VERSION})
    )


def build_checkpoint(name: str, spec: _Spec, directory: Path, *, extra_tokens: tuple[str, ...] = ()) -> None:
    """Build the random-weight HF checkpoint of ``spec`` into ``directory`` (``save_pretrained``).

    Public so that other runtimes' built-in models (the llama.cpp GGUFs) start
    from the same checkpoints, with their own specs. ``extra_tokens`` are added to
    the vocabulary before the model is sized to it (llama.cpp's SmolVLM support
    looks up ``"\\n\\n"`` as a single token, as in SmolLM's real vocabulary).
    """
    import torch
    from transformers import GenerationConfig

    from .tokenizer import QWEN_SPECIAL_TOKENS, smolvlm_special_tokens, train_tokenizer

    if spec.family == "smolvlm":
        tokenizer = train_tokenizer(
            smolvlm_special_tokens(), eos_token="<end_of_utterance>", pad_token="<|endoftext|>", vocabulary=spec.vocabulary
        )
    else:
        tokenizer = train_tokenizer(QWEN_SPECIAL_TOKENS, eos_token="<|im_end|>", pad_token="<|endoftext|>", vocabulary=spec.vocabulary)
    if extra_tokens:
        from tokenizers import AddedToken

        tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in extra_tokens])
    if spec.family == "smolvlm":
        config, model_class, processor = _smolvlm_parts(spec, tokenizer)
    else:
        config, model_class, processor = _qwen_parts(spec, tokenizer)
    # A private generator state: building a model must not disturb the caller's RNG.
    dtype = getattr(torch, spec.save_dtype) if spec.save_dtype else None
    default = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        if dtype is not None:
            # Built in that dtype from the start: a 2B model in float32 would need twice the memory.
            torch.set_default_dtype(dtype)
        try:
            model = model_class(config)
        finally:
            torch.set_default_dtype(default)
    model.eval()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    processor.save_pretrained(directory)
    if spec.finish:
        module_name, _, attr = spec.finish.partition(":")
        getattr(importlib.import_module(module_name), attr)(directory, tokenizer, spec)
    _write_marker(directory, name)


def _text_config(spec: _Spec, tokenizer: Any) -> dict[str, Any]:
    """The spec's language model sized to the trained vocabulary, with its special token ids."""
    return dict(
        spec.text, vocab_size=len(tokenizer), bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _qwen_parts(spec: _Spec, tokenizer: Any) -> tuple[Any, Any, Any]:
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    classes = {
        "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration"),
        "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration"),
        "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration"),
    }[spec.family]
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")}
    text = _text_config(spec, tokenizer)
    config = getattr(transformers, classes[0])(
        text_config=text,
        vision_config=dict(spec.vision),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        **spec.extra,
    )
    processor = Qwen2VLImageProcessorPil(**spec.processor)
    return config, getattr(transformers, classes[1]), processor


def _smolvlm_parts(spec: _Spec, tokenizer: Any) -> tuple[Any, Any, Any]:
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    text = _text_config(spec, tokenizer)
    config = SmolVLMConfig(
        text_config=text,
        vision_config=dict(spec.vision),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        pad_token_id=tokenizer.pad_token_id,
        **spec.extra,
    )
    processor = SmolVLMImageProcessorPil(**spec.processor)
    return config, SmolVLMForConditionalGeneration, processor
