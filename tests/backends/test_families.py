"""Every family the generic transformers backend serves: cached path == the runtime's own pixel path.

(a) cached: references encoded by refsight, stored with ``refsight.store``, read back in a NEW
process and generated from through ``mm_encoder_outputs`` (no pixels) beside a fresh candidate;
(b) fresh: transformers' own way, with none of refsight's prompt code: the family's processor
(built over its PIL image processor, no video processor) renders the checkpoint's chat template,
expands the images and returns the pixels, and ``model.generate(**inputs)`` runs the tower.

Greedy tokens must be identical and the logits' max |Δ| exactly 0, with one and with three
references (plus the candidate) per prompt, two prompts of different lengths per batch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backend_models import GENERIC_FAMILIES, TOWER_CALLS
from worker_spec import (
    CANDIDATE, REFS, assert_only_candidates_reached_vision, assert_rows_match, layout, run_cached_path,
)

MAX_NEW_TOKENS = 6
#: Families whose vision tower runs all of a call's images as one sequence (Pixtral: Mistral 3, LightOnOCR; block-diagonal
#: attention over the concatenated patches): the fresh path's batch of 8 images sums in another order
#: than one image at a time. Measured max |Δ| 1.2e-7 and 2.4e-7 (fp32, CPU); greedy tokens stay identical.
#: Step 3.7 likewise runs the call's images as one batch through its tower (global views, then local crops): measured
#: max |Δ| 1.2e-7, greedy tokens identical.
LOGITS_BOUND = {"tiny-mistral3": 1e-6, "tiny-lighton-ocr": 1e-6, "tiny-step3p7": 1e-6}
WORKER = Path(__file__).with_name("_cached_worker.py")


@pytest.fixture(scope="module")
def cached_results(load, photos, tmp_path_factory):
    """Encode the references, store them, and run the cached path in a new process (every family at once)."""
    backends = {name: load(name) for name in GENERIC_FAMILIES}
    tmp = tmp_path_factory.mktemp("families")
    return run_cached_path(WORKER, tmp, photos, backends, MAX_NEW_TOKENS, threads=torch.get_num_threads())


def _processor(name: str):
    """The family's processor from the checkpoint's files: PIL image processor, tokenizer, settings, template."""
    from transformers import AutoTokenizer

    from refsight.backends.hf.classes import family_classes, processor_class
    from refsight.backends.hf.generic import GenericBackend
    from refsight.backends.hf.processor import image_only_processor
    from refsight.builtin_models.checkpoints import ensure_model_dir
    from refsight.builtin_models.family_checkpoints import FAMILY_SPECS

    directory = str(ensure_model_dir(name))
    classes = family_classes(FAMILY_SPECS[name].model_type)
    image_processor = type("P", (GenericBackend,), {"image_processor_name": classes.image_processor}).image_processor_class()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.padding_side = "left"
    return image_only_processor(
        processor_class(classes.processor), directory, image_processor.from_pretrained(directory), tokenizer, {}, name
    )


def pixel_path(backend, name: str, photos, n_refs: int):
    """transformers' own pixel path for layout(n_refs): processor → generate, two prompts in one batch."""
    processor = _processor(name)
    rows = layout(n_refs)
    texts, images = [], []
    for row in rows:
        content = [{"type": "text", "text": s[1]} if s[0] == "text" else {"type": "image"} for s in row]
        messages = [{"role": "user", "content": content}]
        texts.append(processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        images.append([photos[REFS[s[1]]].image if s[0] == "ref" else photos[CANDIDATE].image for s in row if s[0] != "text"])
    inputs = processor(text=texts, images=images, padding=True, return_tensors="pt", add_special_tokens=False)
    inputs.pop("labels", None)  # PaliGemma's training targets, not a generation input
    eos = backend.eos_ids()
    with torch.inference_mode():
        out = backend.model.generate(
            **inputs, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, output_logits=True, return_dict_in_generate=True,
            pad_token_id=processor.tokenizer.pad_token_id, eos_token_id=eos,
        )
    width = inputs["input_ids"].shape[1]
    results = []
    for b in range(out.sequences.shape[0]):
        new = out.sequences[b, width:].tolist()[:MAX_NEW_TOKENS]
        for k, token in enumerate(new):
            if token in eos:
                new = new[: k + 1]
                break
        results.append((new, torch.stack([step[b] for step in out.logits[: len(new)]]).float()))
    return results


@pytest.mark.parametrize("n_refs", [1, 3])
@pytest.mark.parametrize("name", GENERIC_FAMILIES)
def test_cached_path_from_disk_in_new_process_equals_pixel_path(cached_results, load, photos, name, n_refs):
    backend = load(name)
    fresh = pixel_path(backend, name, photos, n_refs)
    assert_rows_match(cached_results[f"{name}/{n_refs}"]["rows"], fresh, LOGITS_BOUND.get(name, 0.0))


@pytest.mark.parametrize("name", GENERIC_FAMILIES)
def test_cached_references_run_no_vision_in_new_process(cached_results, load, name):
    # Only the two fresh candidates (one per prompt) reach the processor and the tower (in one batch
    # where the family batches: Qwen3-VL-MoE); the stored references never do.
    towers = TOWER_CALLS.get(name, 1) * (1 if load(name).traits.batch else 2)
    assert_only_candidates_reached_vision(cached_results, name, towers)


@pytest.mark.parametrize("name", ["tiny-qwen3.5", "tiny-qwen3.5-moe"])
def test_qwen3_5_keeps_qwens_grid_pixel_bounds_and_batched_encodes(load, photos, name):
    # An image's tokens follow from its size alone (counted before any encode), the pixel bounds are load
    # options that move them, and a batch of references is one tower call, as for Qwen3-VL.
    from backend_models import vision_tower

    backend = load(name)
    assert backend.traits.grid and backend.traits.batch and backend.traits.options == "pixel_bounds"
    images = [photos[r] for r in REFS]
    calls: list[int] = []
    hook = vision_tower(backend).register_forward_hook(lambda *a: calls.append(1))
    try:
        packages = backend.encode(images)
    finally:
        hook.remove()
    assert len(calls) == 1
    assert [backend.image_token_count(i) for i in images] == [int(p.metadata["num_tokens"]) for p in packages]
    small = load(name, max_pixels=64 * 64)  # the checkpoint's bounds are 64²..80² px, 16 px a token
    counted = [small.image_token_count(i) for i in images]
    assert counted == [int(p.metadata["num_tokens"]) for p in small.encode(images)]
    assert max(counted) <= 16 and sum(counted) < sum(int(p.metadata["num_tokens"]) for p in packages)
