"""Built-in offline GGUF models: tiny random HF checkpoints converted with llama.cpp's own converter.

Each model is a :class:`~refsight.builtin_models.checkpoints.ModelSpec` built with the same code
as the transformers ``tiny-*`` models (:func:`refsight.builtin_models.checkpoints.build_checkpoint`),
then converted twice by ``convert_hf_to_gguf.py`` from the llama-cpp-python sdist
(once for the language model, once with ``--mmproj`` for the vision side). The specs
respect what the converter and the runtime need: vision depth ≥ 3, vision head
dims divisible by 4, and for Qwen ``sum(mrope_section) * 2 == head_dim``. The
trained tokenizer's pre-tokenizer is unknown to the converter (it identifies
pre-tokenizers by hashing their output), so it is mapped to one llama.cpp knows.

More families (Gemma 3, InternVL, Mistral 3, ...) are built from the transformers
tiny-family recipes by :mod:`.gguf_families`, through :func:`ensure_gguf` too; both convert with
:mod:`.gguf_converter`.

Results live in the model cache (``$REFSIGHT_MODEL_CACHE``) as
``<name>-<build id>/{model.gguf,mmproj.gguf}``; the sdist is fetched once with
``pip download`` into the same cache (or taken from ``$REFSIGHT_LLAMA_CPP_SRC``,
an unpacked sdist or its ``vendor/llama.cpp``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import UnknownModelError
from ..support.extras import LLAMA_CPP_PYTHON_VERSION
from .gguf_converter import MMPROJ_FILE, MODEL_FILE, convert, converter_dir
from .checkpoints import QWEN2_VISION, QWEN25_VISION, QWEN_TINY_TEXT, TINY_MODELS, ModelSpec, build_checkpoint, build_into_cache, qwen_spec, smolvlm_spec

__all__ = ["GGUF_MODELS", "GgufSpec", "ensure_gguf"]

#: Bump when a recipe below changes, so old cache entries are not reused.
BUILD_VERSION = 1

# Chat templates written into the checkpoints (the converter copies them into the
# GGUF), so the built-in models carry their own template like real GGUFs do.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


@dataclass(frozen=True)
class GgufSpec:
    """A built-in GGUF model: the HF recipe, the pre-tokenizer it maps to, the output types."""

    spec: ModelSpec
    pre_tokenizer: str  # a name llama.cpp knows: "qwen2", "smollm"
    chat_template: str
    outtype: str = "f32"  # of the language model
    mmproj_outtype: str = "f32"
    extra_tokens: tuple[str, ...] = ()  # added to the trained vocabulary


def _with_text(spec: ModelSpec, **text: object) -> ModelSpec:
    return replace(spec, text={**spec.text, **text})


GGUF_MODELS: dict[str, GgufSpec] = {
    "tiny-qwen2-vl-gguf": GgufSpec(qwen_spec("qwen2_vl", dict(QWEN2_VISION, depth=3)), "qwen2", CHATML_TEMPLATE),
    "tiny-qwen2.5-vl-gguf": GgufSpec(
        qwen_spec("qwen2_5_vl", dict(QWEN25_VISION, depth=3, fullatt_block_indexes=[2])), "qwen2", CHATML_TEMPLATE
    ),
    "tiny-smolvlm-gguf": GgufSpec(
        # hidden 96, not Qwen's 64: the two families' mmprojs must not fit each other's model.
        _with_text(
            smolvlm_spec((32, 64, 3, 2, 32, 8), (96, 192, 2, 4, 2, 4096), longest_edge=64, tile=32, scale_factor=2),
            # The converter picks the language model class from the text config's architecture.
            architectures=["VLlama3ForCausalLM"],
        ),
        pre_tokenizer="smollm",
        chat_template=SMOLVLM_TEMPLATE,
        # mtmd's Idefics3 layout puts the token "\n\n" (looked up whole) before the overview image.
        extra_tokens=("\n\n",),
    ),
    # Qwen2-VL-2B's vision tower and projector at full size (f16, as published mmproj
    # files are); a one-layer language model. For the benchmark.
    "shape-qwen2-vl-2b-gguf": GgufSpec(
        TINY_MODELS["shape-qwen2-vl-2b"],  # the same checkpoint as the transformers benchmark model
        pre_tokenizer="qwen2",
        chat_template=CHATML_TEMPLATE,
        outtype="f16",
        mmproj_outtype="f16",
    ),
}


def _build_id(name: str) -> str:
    import transformers

    entry = GGUF_MODELS[name]
    recipe = json.dumps(
        {
            # A spec without a vocabulary of its own hashes as before the field existed (same cache entries).
            "spec": {k: v for k, v in entry.spec.__dict__.items() if k != "vocabulary" or v is not None},
            "pre": entry.pre_tokenizer,
            "template": entry.chat_template,
            "outtypes": [entry.outtype, entry.mmproj_outtype],
            "extra_tokens": list(entry.extra_tokens),
            "build": BUILD_VERSION,
            "transformers": transformers.__version__,
            "converter": LLAMA_CPP_PYTHON_VERSION,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def ensure_gguf(name: str) -> tuple[Path, Path]:
    """Build ``name`` into the model cache unless it is there; return (model GGUF, mmproj GGUF).

    Built like every built-in model (:func:`refsight.builtin_models.checkpoints.build_into_cache`):
    in a temporary directory renamed into place, under a file lock.
    """
    from .gguf_families import FAMILY_GGUFS, build_family_gguf, family_build_id

    if name in FAMILY_GGUFS:  # the families built from the transformers tiny-family recipes
        target = build_into_cache(name, family_build_id(name), MMPROJ_FILE, lambda tmp: build_family_gguf(name, tmp),
                                  "the built-in GGUF")
        return target / MODEL_FILE, target / MMPROJ_FILE
    if name not in GGUF_MODELS:
        raise UnknownModelError(name, [*GGUF_MODELS, *FAMILY_GGUFS])
    target = build_into_cache(name, _build_id(name), MMPROJ_FILE, lambda tmp: _build(name, tmp), "the built-in GGUF")
    return target / MODEL_FILE, target / MMPROJ_FILE


def _build(name: str, directory: Path) -> None:
    entry = GGUF_MODELS[name]
    hf_dir = directory / "hf"
    build_checkpoint(name, entry.spec, hf_dir, extra_tokens=entry.extra_tokens)
    (hf_dir / "chat_template.jinja").write_text(entry.chat_template)
    source = converter_dir()
    for outfile, outtype, extra in (
        (MODEL_FILE, entry.outtype, []),
        (MMPROJ_FILE, entry.mmproj_outtype, ["--mmproj"]),
    ):
        convert(source, hf_dir, directory / outfile, outtype, entry.pre_tokenizer, extra)
    (directory / "refsight_model.json").write_text(
        json.dumps({"random_weights": True, "model_id": f"refsight/{name}", "build": BUILD_VERSION})
    )
    # The HF checkpoint was only the converter's input; the GGUFs are the model now.
    shutil.rmtree(hf_dir)


# The bases of the quantized built-ins (.quantized): converted to f16, model and mmproj, as
# published GGUFs are before ``llama-quantize``. The tiny Qwen2-VL in f16, and Qwen2-VL-2B's
# whole shape with the real 28-layer language model (the transformers ``shape-qwen2-vl-2b-full``).
GGUF_MODELS["tiny-qwen2-vl-gguf-f16"] = GgufSpec(
    GGUF_MODELS["tiny-qwen2-vl-gguf"].spec, pre_tokenizer="qwen2", chat_template=CHATML_TEMPLATE,
    outtype="f16", mmproj_outtype="f16",
)
# The tiny Qwen2-VL with a language model whose rows are 256 wide (one K-quant block), in f16:
# quantized to Q4_K_M its weights take the kernels real quantized models take (repacked for the
# CPU's matrix instructions), where the 64-wide tiny model falls back to Q5_0. The slots' tests
# prove on it that an answer does not depend on what decodes beside it.
GGUF_MODELS["tiny-qwen2-vl-256-gguf"] = GgufSpec(
    qwen_spec(
        "qwen2_vl", dict(QWEN2_VISION, depth=3, hidden_size=256),
        dict(QWEN_TINY_TEXT, hidden_size=256, intermediate_size=512,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]}),
    ),
    pre_tokenizer="qwen2", chat_template=CHATML_TEMPLATE, outtype="f16", mmproj_outtype="f16",
)
GGUF_MODELS["shape-qwen2-vl-2b-full-gguf"] = GgufSpec(
    TINY_MODELS["shape-qwen2-vl-2b-full"], pre_tokenizer="qwen2", chat_template=CHATML_TEMPLATE,
    outtype="f16", mmproj_outtype="f16",
)
# Qwen3-VL: the transformers tiny model's vision tower (two deepstack layers) with a THREE-layer
# language model. llama.cpp's qwen3vl graph (src/models/qwen3vl.cpp) adds deepstack features
# after each of the first n_deepstack_layers layers, but by the last layer it has already cut
# the rows down to the requested outputs (inp_out_ids); were the last layer a deepstack layer,
# that add of [n_embd, n_tokens] onto [n_embd, n_outputs] aborts in ggml_add
# (GGML_ASSERT(ggml_can_repeat(b, a))). So the language model needs more layers than deepstack
# layers, as every real Qwen3-VL has (28 or more layers, 3 deepstack layers).
GGUF_MODELS["tiny-qwen3-vl-gguf"] = GgufSpec(
    ModelSpec(
        "qwen3_vl", vision=TINY_MODELS["tiny-qwen3-vl"].vision,
        text=dict(TINY_MODELS["tiny-qwen3-vl"].text, num_hidden_layers=3),
        processor=TINY_MODELS["tiny-qwen3-vl"].processor, extra={},
    ),
    pre_tokenizer="qwen2", chat_template=CHATML_TEMPLATE,
)
