"""Cache speed-up: one candidate against R references, fresh path vs cached path.

For R = 1 and 4 (at 448×448 by default), greedy, same prompt, in one run:

- ``fresh_ms``: refsight's fresh path, every reference re-encoded from its image;
- ``cached_ms``: refsight's cached path, reference packages loaded from a
  ``refsight.store`` on disk (a newly opened store, so the memory tier is cold)
  plus the fresh candidate; the load time is included;
- ``peer_ms``: the plain transformers way (image processor + ``model.generate``
  with every image as pixels, every request); for a llama.cpp model, llama.cpp on
  its own (``mtmd_tokenize`` with every real bitmap + ``mtmd_helper_eval_chunks``,
  i.e. re-encoding every reference every request, as llama-server does).
  For ``--model vllm:URL``, the plain vLLM way: every image sent to the server as a
  PNG, every request.

Reference side: ``reference_encode_ms`` (encode one reference) and
``reference_load_ms`` (load its package from disk), ``ref_side_ratio`` = their
quotient. ``cached_over_encode_plus_lm`` compares ``cached_ms`` with the
candidate's encode time plus the language-model time measured inside the same
cached call (target ≤ 1.10: the cache adds no cost of its own).

With ``--prefix-states`` (transformers) the cached path also serves the references' prefix
(KV) state from the store, as refsight's judge does: the state is built once beforehand, not
timed (the references' language-model work, done once like their encodes), and loaded cold
from disk inside ``cached_ms``; ``prefix_tokens_reused`` says how many prompt tokens it covered.
A real-shape model for it: ``--model shape-gemma3-4b --dtype bfloat16 --refs 4 --prefix-states``
(SigLIP-so400m at 896² and Gemma 3 4B's 34 layers; one 896² encode costs ~105 s in bf16 and
~160 s in float32 on two CPU cores, so bf16).

Prints ONE JSON line: the R = 4 figures at top level (as the issue names them)
and every R under ``runs``. Weights are random (``random_weights: true``): the
timings are real, the text is not.

    python benchmarks/cache_speedup.py --model shape-qwen2-vl-2b [--device cuda --dtype bfloat16]
    python benchmarks/cache_speedup.py --model shape-qwen2-vl-2b-gguf
    python benchmarks/cache_speedup.py --model llamacpp:M.gguf --mmproj P.gguf
    python benchmarks/cache_speedup.py --model vllm:http://127.0.0.1:8000 --size 112

With ``vllm:`` (a server with a vision encoder) vLLM encodes every image and the
cached path sends the references by uuid; pick ``--size`` on the model's patch grid and
within its pixel bounds, so that vLLM's torchvision resize and refsight's PIL resize are
both no-ops and the peer's tokens can be compared. Start that server without vLLM's own
caches and with refsight's connector, so that the cached path's references come from the
store (``benchmarks/vllm_cache.py`` measures the whole picture, vLLM's caches on and off)::

    refsight vllm-serve shape-qwen2-vl-2b-vllm --port 8000 --store /tmp/bench-store \
        --vllm-args "--no-enable-prefix-caching --mm-processor-cache-gb 0"
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time


def _photos(size: int):
    from refsight.inputs.images import load_image
    from refsight.samples import load_sample

    def photo(name: str):
        return load_image(load_sample(name, (size, size)), name=name)

    return [photo(n) for n in ("chelsea", "coffee", "astronaut", "rocket")], photo("china")


PROMPT = " Does the candidate match the references?"


def _segments(refs: list, candidate, *, prompt: str) -> list:
    return [*refs, "Compare the candidate", candidate, prompt]


def _processor_peer(backend, images: list, prompt: str, max_new_tokens: int) -> tuple[list[int], float]:
    """The plain transformers way for any family with a processor: the checkpoint's chat template, the
    processor expanding every image from its pixels, ``generate`` running the tower on all of them."""
    import torch

    began = time.perf_counter()
    processor = backend.processor
    content = [*({"type": "image"} for _ in images[:-1]), {"type": "text", "text": "Compare the candidate"},
               {"type": "image"}, {"type": "text", "text": prompt}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[text], images=[images], return_tensors="pt", add_special_tokens=False)
    inputs.pop("labels", None)  # PaliGemma's training targets
    inputs = {k: v.to(backend.device) if hasattr(v, "to") else v for k, v in inputs.items()}
    eos = backend.eos_ids()
    with torch.inference_mode():
        out = backend.model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens,
                                     pad_token_id=backend.pad_id(), eos_token_id=eos)
    ms = (time.perf_counter() - began) * 1000
    tokens = out[0, inputs["input_ids"].shape[1]:].tolist()
    for k, token in enumerate(tokens):
        if token in eos:
            tokens = tokens[: k + 1]
            break
    return tokens, ms


def _peer(backend, images: list, prompt: str, max_new_tokens: int) -> tuple[list[int], float]:
    """The plain transformers way: processor on all images, placeholders from its output, generate with pixels."""
    import torch

    if hasattr(backend, "processor"):  # the generic backend: the family's own processor
        return _processor_peer(backend, images, prompt, max_new_tokens)
    began = time.perf_counter()
    processor = backend.image_processor
    if backend.family.startswith("qwen"):
        pixels = processor(images, return_tensors="pt")
        merge = backend.model.config.vision_config.spatial_merge_size
        counts = (pixels["image_grid_thw"].prod(-1) // merge**2).tolist()
        parts = ["<|vision_start|>" + "<|image_pad|>" * c + "<|vision_end|>" for c in counts]
        extra = {"pixel_values": pixels["pixel_values"], "image_grid_thw": pixels["image_grid_thw"]}
    else:
        from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

        pixels = processor([images], return_tensors="pt", return_row_col_info=True)
        parts = [
            get_image_prompt_string(r, c, backend.model.model.image_seq_len, "<fake_token_around_image>", "<image>", "<global-img>")
            for r, c in zip(pixels["rows"][0], pixels["cols"][0])
        ]
        extra = {"pixel_values": pixels["pixel_values"], "pixel_attention_mask": pixels["pixel_attention_mask"]}
    text = backend.chat_prompt([*parts[:-1], "Compare the candidate", parts[-1], prompt])
    encoded = backend.tokenizer([text], return_tensors="pt", add_special_tokens=False)
    if backend.family.startswith("qwen"):
        extra["mm_token_type_ids"] = (encoded["input_ids"] == backend.model.config.image_token_id).int()
    # The model's device (cuda with --device cuda); the model casts pixels to its dtype.
    encoded = {k: v.to(backend.device) for k, v in encoded.items()}
    extra = {k: v.to(backend.device) for k, v in extra.items()}
    eos = backend.tokenizer.eos_token_id
    with torch.inference_mode():
        out = backend.model.generate(
            **encoded, **extra, do_sample=False, max_new_tokens=max_new_tokens,
            pad_token_id=backend.tokenizer.pad_token_id, eos_token_id=[eos],
        )
    ms = (time.perf_counter() - began) * 1000
    tokens = out[0, encoded["input_ids"].shape[1]:].tolist()
    if eos in tokens:
        tokens = tokens[: tokens.index(eos) + 1]
    return tokens, ms


def _vllm_peer(backend, images: list, prompt: str, max_new_tokens: int) -> tuple[list[int], float]:
    """The plain vLLM way: one OpenAI request with every image as a PNG (no refsight request code)."""
    import base64
    import io
    import urllib.request

    def part(image):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()}}

    began = time.perf_counter()
    content = [*map(part, images[:-1]), {"type": "text", "text": "Compare the candidate"}, part(images[-1]), {"type": "text", "text": prompt}]
    body = {
        "model": backend.served_model, "messages": [{"role": "user", "content": content}],
        "max_tokens": max_new_tokens, "temperature": 0.0, "return_token_ids": True,
    }
    request = urllib.request.Request(
        f"{backend.client.base_url}/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=3600) as response:
        answer = json.loads(response.read())
    return answer["choices"][0]["token_ids"], (time.perf_counter() - began) * 1000


def _peer_llamacpp(backend, images: list, prompt: str, max_new_tokens: int) -> tuple[list[int], float]:
    """llama.cpp alone: real bitmaps for every image, ``mtmd_helper_eval_chunks``, greedy decoding."""
    import ctypes

    import llama_cpp as L
    import llama_cpp.mtmd_cpp as M

    rt = backend.runtime
    began = time.perf_counter()
    text = backend.prompt_text([*images[:-1], "Compare the candidate", images[-1], prompt]).encode()
    rt.clear()
    bitmaps = []
    for image in images:
        rgb = image.image.tobytes()
        bitmaps.append(M.mtmd_bitmap_init(image.image.width, image.image.height, (ctypes.c_uint8 * len(rgb)).from_buffer_copy(rgb)))
    chunks = M.mtmd_input_chunks_init()
    inp = M.mtmd_input_text()
    inp.text, inp.text_len, inp.add_special, inp.parse_special = text, len(text), False, True
    assert M.mtmd_tokenize(rt.mctx, chunks, ctypes.byref(inp), (M.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps), len(bitmaps)) == 0
    n_past = L.llama_pos(0)
    assert M.mtmd_helper_eval_chunks(rt.mctx, rt.ctx, chunks, 0, 0, rt.settings.n_batch, True, ctypes.byref(n_past)) == 0
    M.mtmd_input_chunks_free(chunks)
    for b in bitmaps:
        M.mtmd_bitmap_free(b)
    tokens, pos = [], n_past.value
    for step in range(max_new_tokens):
        token = int(rt.last_logits().argmax())
        tokens.append(token)
        if rt.is_eog(token) or step + 1 == max_new_tokens:
            break
        pos = rt.decode_token(token, pos)
    return tokens, (time.perf_counter() - began) * 1000


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="shape-qwen2-vl-2b")
    parser.add_argument("--size", type=int, default=448, help="image side in pixels")
    parser.add_argument("--refs", default="1,4", help="comma-separated reference counts")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N or mps (default: the backend's, auto)")
    parser.add_argument("--dtype", default=None, help="auto, float32, bfloat16 or float16 (default: auto)")
    parser.add_argument("--mmproj", default=None, help="the mmproj GGUF of a llamacpp:M.gguf model")
    parser.add_argument("--prefix-states", action="store_true",
                        help="the cached path also serves the references' stored prefix (KV) state (transformers)")
    return parser


def _is_llama(model: str) -> bool:
    return model.startswith("llamacpp:") or model.endswith("-gguf")


def _load_backend(args):
    """The backend through the registry, with only the options given; (backend, seconds)."""
    from refsight.backends.registry import get_backend

    began = time.perf_counter()
    options = {k: v for k, v in (("device", args.device), ("dtype", args.dtype), ("mmproj", args.mmproj)) if v is not None}
    if _is_llama(args.model):
        options["n_threads"] = args.threads
    return get_backend(args.model, **options), time.perf_counter() - began


def _peer_for(model: str):
    """The runtime's own way for ``model``: ``peer(backend, images, prompt, max_new_tokens) -> (tokens, ms)``."""
    if _is_llama(model):
        return _peer_llamacpp
    pixels = _vllm_peer if model.startswith("vllm:") else _peer
    return lambda backend, images, prompt, mnt: pixels(backend, [i.image for i in images], prompt, mnt)


def _device(backend) -> str | None:
    """Where the model runs, when the backend says (transformers: its torch device); None for llama.cpp or a vLLM server."""
    device = getattr(backend, "device", None)
    return None if device is None else str(device)


def _reference_side(backend, refs: list, root: str) -> tuple[list[float], list[float], list]:
    """Encode each reference once and store it; load each back from a newly opened store (cold memory tier)."""
    from refsight.store import open_store

    encode_ms, packages = [], []
    for ref in refs:
        t = time.perf_counter()
        packages.append(backend.encode([ref])[0])
        encode_ms.append((time.perf_counter() - t) * 1000)
    with open_store(root) as store:
        for package in packages:
            store.packages.put(package)
    load_ms = []
    with open_store(root) as store:  # a new Store: empty memory tier, packages come from disk
        for package in packages:
            t = time.perf_counter()
            assert store.packages.get(package.key) is not None
            load_ms.append((time.perf_counter() - t) * 1000)
    return encode_ms, load_ms, packages


def _build_prefix_state(backend, packages: list, root: str) -> None:
    """The references' prefix state, built once and stored (not timed): a request with a text-only suffix
    renders the same prefix, so the timed request finds its state."""
    from refsight.requests import GenerationRequest
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    with open_store(root) as store:
        request = GenerationRequest([*packages, "Compare the candidate", PROMPT], max_new_tokens=1,
                                    prefix_segments=len(packages), prefix_cache=PrefixStateCache(store))
        backend.generate([request])


def _run(backend, peer, refs: list, candidate, packages: list, root: str, mnt: int, prefix_states: bool) -> dict:
    """One reference count: the fresh path, the cached path (packages loaded cold, load time included), the peer."""
    from refsight.requests import GenerationRequest
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    r = len(refs)
    fresh_request = GenerationRequest(_segments(refs, candidate, prompt=PROMPT), max_new_tokens=mnt)
    t = time.perf_counter()
    fresh = backend.generate([fresh_request])[0]
    fresh_ms = (time.perf_counter() - t) * 1000
    if prefix_states:
        _build_prefix_state(backend, packages[:r], root)
    with open_store(root) as store:  # a new Store: packages and prefix states come from disk
        t = time.perf_counter()
        cached_refs = [store.packages.get(p.key) for p in packages[:r]]
        # The references lead the prompt: on vllm: they travel by uuid (the server's caches, its connector).
        request = GenerationRequest(_segments(cached_refs, candidate, prompt=PROMPT), max_new_tokens=mnt, prefix_segments=r,
                                    prefix_cache=PrefixStateCache(store) if prefix_states else None)
        cached = backend.generate([request])[0]
        cached_ms = (time.perf_counter() - t) * 1000
    peer_tokens, peer_ms = peer(backend, [*refs, candidate], PROMPT, mnt)
    inner = cached.timings_ms["encode"] + cached.timings_ms["generate"]
    return {
        "references": r,
        "fresh_ms": round(fresh_ms, 1),
        "cached_ms": round(cached_ms, 1),
        "peer_ms": round(peer_ms, 1),
        "speedup": round(fresh_ms / cached_ms, 3),
        "peer_speedup": round(peer_ms / cached_ms, 3),
        "candidate_encode_ms": round(cached.timings_ms["encode"], 1),
        "lm_ms": round(cached.timings_ms["generate"], 1),
        "cached_over_encode_plus_lm": round(cached_ms / inner, 4),
        "tokens_equal": fresh.token_ids == cached.token_ids == peer_tokens,
        "prefix_tokens_reused": cached.prefix_tokens_reused,
    }


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark and print one JSON line; returns the figures."""
    args = _parser().parse_args(argv)
    import torch

    from refsight.requests import GenerationRequest

    torch.set_num_threads(args.threads)
    counts = [int(r) for r in args.refs.split(",")]
    refs, candidate = _photos(args.size)
    if max(counts) > len(refs):
        raise SystemExit(f"at most {len(refs)} references")
    backend, load_s = _load_backend(args)
    # Warm-up (first-call allocations, lazy imports) on a small image: not timed.
    backend.generate([GenerationRequest(_segments([], _photos(112)[1], prompt=PROMPT), max_new_tokens=2)])
    with tempfile.TemporaryDirectory(prefix="refsight-bench-") as tmp:
        encode_ms, load_ms, packages = _reference_side(backend, refs[: max(counts)], tmp)
        peer = _peer_for(args.model)
        runs = [_run(backend, peer, refs[:r], candidate, packages, tmp, args.max_new_tokens, args.prefix_states)
                for r in counts]
    ref_encode, ref_load = statistics.mean(encode_ms), statistics.mean(load_ms)
    headline = {key: runs[-1][key] for key in
                ("references", "fresh_ms", "cached_ms", "speedup", "peer_ms", "peer_speedup")}
    result = {
        "model": args.model,
        **headline,
        "reference_encode_ms": round(ref_encode, 1),
        "reference_load_ms": round(ref_load, 3),
        "ref_side_ratio": round(ref_encode / ref_load, 1),
        "package_bytes": packages[0].nbytes,
        "image_size": args.size,
        "threads": args.threads,
        "max_new_tokens": args.max_new_tokens,
        "prefix_states": args.prefix_states,
        "model_load_s": round(load_s, 1),
        "device": _device(backend),
        "dtype": backend.fingerprint().dtype,
        "random_weights": backend.random_weights,
        "runs": runs,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
