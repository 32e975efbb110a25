"""Cached path == fresh pixel path, bit for bit, for every tiny model family.

(a) cached: references encoded by refsight, stored with ``refsight.store``, loaded
back with ``.get(key)`` in a NEW process, generated from through
``mm_encoder_outputs`` (no pixels) beside a fresh candidate;
(b) fresh: the plain transformers way, written here independently of refsight's
prompt code: the PIL image processor on every image, the prompt expanded from the
processor's own grid / tile output, ``model.generate(pixel_values=...)``.

Greedy tokens must be identical and the logits' max-abs-diff exactly 0: every op
on these CPU paths is deterministic, and the vision tower sees the same patches
whichever way they are batched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backend_models import TINY_FAMILIES
from worker_spec import (
    CANDIDATE, REFS, assert_only_candidates_reached_vision, assert_rows_match, layout, run_cached_path,
)

MAX_NEW_TOKENS = 6
WORKER = Path(__file__).with_name("_cached_worker.py")


@pytest.fixture(scope="module")
def cached_results(load, photos, tmp_path_factory):
    """Encode the references, store them, and run the cached path in a new process."""
    backends = {name: load(name) for name in TINY_FAMILIES}
    tmp = tmp_path_factory.mktemp("equivalence")
    return run_cached_path(WORKER, tmp, photos, backends, MAX_NEW_TOKENS, threads=torch.get_num_threads())


def _trim(sequences, logits, prompt_len: int, eos_ids: list[int]):
    rows = []
    for b in range(sequences.shape[0]):
        new = sequences[b, prompt_len:].tolist()[:MAX_NEW_TOKENS]
        for k, token in enumerate(new):
            if token in eos_ids:
                new = new[: k + 1]
                break
        rows.append((new, torch.stack([step[b] for step in logits[: len(new)]]).float()))
    return rows


def pixel_path(backend, name: str, photos, n_refs: int):
    """The plain transformers pixel path for layout(n_refs), independent of refsight's prompt code."""
    from transformers import AutoTokenizer

    from refsight.builtin_models.checkpoints import ensure_model_dir

    directory = ensure_model_dir(name)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.padding_side = "left"
    model = backend.model
    rows = layout(n_refs)
    images = [[photos[REFS[s[1]]].image if s[0] == "ref" else photos[CANDIDATE].image for s in row if s[0] != "text"] for row in rows]
    if "smolvlm" in name:
        from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil
        from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

        processor = SmolVLMImageProcessorPil.from_pretrained(directory)
        pixels = processor(images, return_tensors="pt", return_row_col_info=True)
        texts = []
        for r, row in enumerate(rows):
            k, parts = 0, []
            for s in row:
                if s[0] == "text":
                    parts.append(s[1])
                else:
                    parts.append(
                        get_image_prompt_string(
                            pixels["rows"][r][k], pixels["cols"][r][k], model.model.image_seq_len,
                            fake_token_around_image="<fake_token_around_image>", image_token="<image>",
                            global_image_token="<global-img>",
                        )
                    )
                    k += 1
            texts.append("<|im_start|>User" + (":" if row[0][0] != "text" else ": ") + "".join(parts) + "<end_of_utterance>\nAssistant:")
        extra = {"pixel_values": pixels["pixel_values"], "pixel_attention_mask": pixels["pixel_attention_mask"]}
    else:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        processor = Qwen2VLImageProcessorPil.from_pretrained(directory)
        flat = [image for row in images for image in row]
        pixels = processor(flat, return_tensors="pt")
        merge = model.config.vision_config.spatial_merge_size
        counts = iter((pixels["image_grid_thw"].prod(-1) // merge**2).tolist())
        system = "" if "qwen3" in name else "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        texts = []
        for row in rows:
            content = "".join(
                s[1] if s[0] == "text" else "<|vision_start|>" + "<|image_pad|>" * next(counts) + "<|vision_end|>" for s in row
            )
            texts.append(f"{system}<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n")
        extra = {"pixel_values": pixels["pixel_values"], "image_grid_thw": pixels["image_grid_thw"]}
    encoded = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    if "smolvlm" not in name:
        extra["mm_token_type_ids"] = (encoded["input_ids"] == model.config.image_token_id).int()
    eos = [tokenizer.eos_token_id]
    with torch.inference_mode():
        out = model.generate(
            **encoded, **extra, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, output_logits=True,
            return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos,
        )
    return _trim(out.sequences, out.logits, encoded["input_ids"].shape[1], eos)


@pytest.mark.parametrize("n_refs", [1, 3])
@pytest.mark.parametrize("name", TINY_FAMILIES)
def test_cached_path_from_disk_in_new_process_equals_pixel_path(cached_results, load, photos, name, n_refs):
    backend = load(name)
    fresh = pixel_path(backend, name, photos, n_refs)
    rows = cached_results[f"{name}/{n_refs}"]["rows"]
    assert_rows_match(rows, fresh)
    assert all({"encode", "generate"} <= set(row["timings"]) for row in rows)


@pytest.mark.parametrize("name", TINY_FAMILIES)
def test_cached_references_run_no_vision_in_new_process(cached_results, load, name):
    # Only the two fresh candidates (one per prompt) reach the processor and the tower (in one
    # batch where the family batches: Qwen); the stored references never do.
    assert_only_candidates_reached_vision(cached_results, name, 1 if load(name).traits.batch else 2)


def test_the_cached_path_read_packages_the_codec_compressed(cached_results):
    # Every package the new process read was a compressed container, read through zstd frames:
    # the equality above holds through the store's codec, not around it.
    use = cached_results["codec"]
    assert use["compressed"] == use["files"] >= len(TINY_FAMILIES) and use["zstd_frames"] > 0, use
