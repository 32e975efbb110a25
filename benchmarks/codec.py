"""The store's lossless codec, chosen by measurement on every kind of bytes the store holds.

The kinds come from real runs through an Engine in a throwaway store (``--models``: each model adds two
references and answers one request over them, so the store writes their packages and the prompt's
reference-prefix state), read back from the store's own files and split by what each tensor is:

- ``package f32|bf16|f16``: a transformers model's visual package (``name:dtype`` picks the dtype);
- ``llama.cpp package f32``: a GGUF model's image embeddings;
- ``kv f32|bf16|f16``: attention key/value tensors of a transformers prefix state;
- ``recurrent f32``: the conv and recurrent tensors of a hybrid model's state (the Qwen3.5 built-ins);
- ``llama.cpp state``: a llama.cpp sequence state (an opaque byte blob, mostly f16 KV cells);
- ``real features f32|bf16|f16``: EfficientNet-Lite0's activation maps from its real pretrained weights
  on the bundled photos (``block``: the last block's projection, dense; ``head``: after ReLU6, with its
  zeros). The built-in VLMs have RANDOM weights, and random floats compress differently from trained
  ones (their mantissas are noise either way; their exponents spread differently): these are the
  kinds from real weights.

Candidates: zstd at levels 1, 3 and 9, lz4 and lz4 HC (when ``lz4`` is installed), zlib, python-blosc's
SIMD shuffles (when ``blosc`` is installed), each plain, after a byte-plane shuffle (numpy) and after a
bit-plane shuffle (numpy), and ``adaptive+zstd-1`` (per frame the smaller of zstd-1 over byte planes and
over plain bytes). Per kind and candidate: ``ratio`` (raw / stored), ``compress_ms_per_mb`` and
``decompress_ms_per_mb`` (per MB of raw bytes, one thread, best of ``--repeats``; every decode checked
equal to its input) and ``read_mb_s``: the raw MB/s a reader gets when the stored bytes arrive at the
fleet's object-store read bar (``BAR_MB_S``, 137 MB/s) and one core decodes them. The rule, read speed
first and ratio second: among candidates that encode at >= ``WRITE_FLOOR_MB_S``, those within
``READ_TIE`` of the best ``read_mb_s``, then the best ratio of those, is the kind's ``choice``; ``raw``
when that ratio is under the store's ``MIN_RATIO`` or nothing reads faster than the raw bytes.
``overall`` is the one candidate with the least read time over every kind (the store has one codec);
``store`` is what the store's codec (``refsight.vllm_connector.refsight_codec``) does with the same bytes, end to end
(its frames, checks and checksums included).

Prints ONE JSON line. Usage: ``python benchmarks/codec.py [--models a,b:bfloat16] [--size 448] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import zlib
from collections import defaultdict
from pathlib import Path

DEFAULT_MODELS = (
    "shape-qwen2-vl-2b,shape-qwen2-vl-2b:bfloat16,shape-qwen2-vl-2b:float16,shape-qwen3.5-0.8b,"
    "shape-qwen2-vl-2b-gguf-q4,tiny-qwen3.5-gguf"
)
BAR_MB_S = 137.0
#: Candidates whose read speed at the bar is within this share of the best read as fast; ratio decides among them.
READ_TIE = 0.03
WRITE_FLOOR_MB_S = 100.0
PHOTOS = ("chelsea", "coffee", "astronaut", "rocket")


def _log(message: str) -> None:
    print(f"[codec] {message}", file=sys.stderr, flush=True)


# -- the kinds -----------------------------------------------------------------------------------
def _kind(file_kind: str, name: str, code: str, llamacpp: bool) -> str:
    dtype = code.lower()
    if file_kind == "package":
        return f"llama.cpp package {dtype}" if llamacpp else f"package {dtype}"
    if code == "U8":
        return "llama.cpp state"
    return f"{'recurrent' if name.split('.')[0] in ('conv', 'recurrent') else 'kv'} {dtype}"


def _store_frames(root: Path, model: str, kinds: dict) -> None:
    """Every tensor of the store's package and prefix files, raw (decoded by the store's codec), by kind."""
    from refsight.store import _safetensors
    from refsight.vllm_connector import refsight_codec

    for file_kind, pattern in (("package", "packages/*/*/*.safetensors"), ("prefix", "prefixes/*/*.safetensors")):
        for path in sorted(root.glob(pattern)):
            raw = refsight_codec.decompress(memoryview(path.read_bytes()))
            layout = _safetensors.describe(raw)
            for name, (code, _, begin, end) in layout.entries.items():
                data = bytes(raw[layout.start + begin : layout.start + end])
                kind = _kind(file_kind, name, code, "gguf" in model)
                kinds[kind].append((data, _safetensors._ITEMSIZE[code], model))
                if code == "U8":  # the blob is mostly f16 cells: measured as 2-byte elements too
                    kinds[f"{kind} (as 2-byte)"].append((data, 2, model))


def _model_kinds(models: list[str], size: int, kinds: dict) -> bool:
    """Run each model through an Engine (2 references, one request); returns whether any had random weights."""
    from refsight import Engine
    from refsight.backends.options import BackendOptions
    from refsight.inputs.images import load_image
    from refsight.samples import load_sample

    random_weights = False
    for spec in models:
        model, _, dtype = spec.partition(":")
        images = [load_image(load_sample(n, (size, size)), name=n) for n in PHOTOS[:3]]
        with tempfile.TemporaryDirectory(prefix="refsight-codec-bench-") as root:
            with Engine(root, model=model, backend_options=BackendOptions(dtype=dtype or None)) as engine:
                list(engine.add_many(images[:2], ids=["a", "b"]))
                engine.generate("Same?", ref_ids=["a", "b"], candidate=images[2], max_new_tokens=1)
                random_weights |= bool(engine.backend().random_weights)
            _store_frames(Path(root), spec, kinds)
        _log(f"{spec}: read back")
    return random_weights


def _real_kinds(size: int, kinds: dict) -> None:
    """EfficientNet-Lite0 activation maps (real pretrained weights) of the bundled photos, as tokens x channels."""
    import torch

    from refsight.embedders.efficientnet_lite import load_efficientnet_lite0
    from refsight.samples import load_sample

    classifier = load_efficientnet_lite0()
    net = classifier.net
    pixels = torch.from_numpy(__import__("numpy").stack(
        [classifier.preprocessing(load_sample(n, (size, size))) for n in PHOTOS]))
    with torch.inference_mode():
        x = torch.nn.functional.relu6(net._bn0(net._conv_stem(pixels)))
        for block in net._blocks:
            x = block(x)
        head = torch.nn.functional.relu6(net._bn1(net._conv_head(x)))
    for part, maps in (("block", x), ("head", head)):
        tokens = maps.flatten(2).transpose(1, 2).contiguous()  # [image, positions, channels], as a VLM's features
        for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16"), (torch.float16, "f16")):
            for image in tokens.to(dtype):
                data = image.contiguous().view(torch.uint8).numpy().tobytes()
                kinds[f"real features {name} ({part})"].append((data, image.element_size(), "efficientnet-lite0"))


# -- the candidates ---------------------------------------------------------------------------------
def _bitshuffle(data: bytes, plane: int) -> bytes:
    import numpy as np

    count = len(data) // plane // 8 * 8  # whole groups of 8 elements; the tail stays as it is
    bits = np.unpackbits(np.frombuffer(data, np.uint8, count * plane).reshape(count, plane), axis=1)
    return np.packbits(bits.T, axis=1).tobytes() + data[count * plane :]


def _unbitshuffle(data: bytes, plane: int, raw_len: int) -> bytes:
    import numpy as np

    count = raw_len // plane // 8 * 8
    bits = np.unpackbits(np.frombuffer(data, np.uint8, count * plane).reshape(plane * 8, count // 8), axis=1)
    return np.packbits(bits.T, axis=1).tobytes() + data[count * plane :]


def _transforms():
    from refsight.vllm_connector.refsight_codec import shuffle, unshuffle_into

    def byte_decode(data, plane, dest):
        unshuffle_into(data, dest, plane) if plane > 1 else dest.__setitem__(slice(None), data)

    return {
        "": (lambda view, plane: view, lambda data, plane, dest: dest.__setitem__(slice(None), data)),
        "shuffle+": (lambda view, plane: shuffle(view, plane) if plane > 1 else view, byte_decode),
        "bitshuffle+": (_bitshuffle, lambda data, plane, dest: dest.__setitem__(slice(None), _unbitshuffle(data, plane, len(dest)))),
    }


def _codecs() -> dict:
    """name -> (compress(bytes) -> bytes, decompress(bytes, raw_len) -> bytes): the general-purpose codecs here."""
    import zstandard

    out = {}
    for level in (1, 3, 9):
        cctx, dctx = zstandard.ZstdCompressor(level=level), zstandard.ZstdDecompressor()
        out[f"zstd-{level}"] = (cctx.compress, lambda data, n, dctx=dctx: dctx.decompress(data, max_output_size=n))
    out["zlib-1"] = (lambda data: zlib.compress(data, 1), lambda data, n: zlib.decompress(data, bufsize=n))
    try:
        import lz4.block
    except ImportError:
        _log("lz4 is not installed: its candidates are left out (pip install lz4)")
        return out
    out["lz4"] = (lambda data: lz4.block.compress(data, store_size=False),
                  lambda data, n: lz4.block.decompress(data, uncompressed_size=n))
    out["lz4hc-9"] = (lambda data: lz4.block.compress(data, mode="high_compression", compression=9, store_size=False),
                      lambda data, n: lz4.block.decompress(data, uncompressed_size=n))
    return out


def candidates() -> dict:
    """name -> (encode(view, plane) -> stored, decode(stored, plane, dest)): every transform before every codec."""
    out = {}
    for prefix, (forward, backward) in _transforms().items():
        for name, (pack, unpack) in _codecs().items():
            out[prefix + name] = (
                lambda view, plane, f=forward, p=pack: p(bytes(f(view, plane))),
                lambda data, plane, dest, b=backward, u=unpack: b(u(data, len(dest)), plane, dest),
            )
    out["adaptive+zstd-1"] = _adaptive()
    out.update(_blosc_candidates())
    return out


def _adaptive():
    """Per frame, the smaller of zstd-1 over its byte planes and over its plain bytes (what the store does)."""
    import zstandard

    from refsight.vllm_connector.refsight_codec import shuffle, unshuffle_into

    cctx, dctx = zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor()

    def encode(view, plane):
        plain = cctx.compress(view)
        planes = cctx.compress(shuffle(view, plane)) if plane > 1 else plain
        return (plane, planes) if len(planes) < len(plain) else (1, plain)

    def decode(stored, plane, dest):
        used, data = stored
        out = dctx.decompress(data, max_output_size=len(dest))
        unshuffle_into(out, dest, used) if used > 1 else dest.__setitem__(slice(None), out)

    return encode, decode


def _blosc_candidates() -> dict:
    try:
        import blosc
    except ImportError:
        _log("python-blosc is not installed: its candidates are left out (pip install blosc)")
        return {}
    blosc.set_nthreads(1)
    out = {}
    for shuffle, label in ((blosc.SHUFFLE, "shuffle"), (blosc.BITSHUFFLE, "bitshuffle")):
        for cname in ("zstd", "lz4"):
            out[f"blosc {label}+{cname}-1"] = (
                lambda view, plane, s=shuffle, c=cname: blosc.compress(bytes(view), typesize=plane, clevel=1, shuffle=s, cname=c),
                lambda data, plane, dest: dest.__setitem__(slice(None), blosc.decompress(data)),
            )
    return out


# -- measuring ----------------------------------------------------------------------------------------
def _best_s(run, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - began)
    return best


def measure(frames: list[tuple[bytes, int]], encode, decode, repeats: int) -> dict:
    """Ratio and ms per MB of one candidate over a kind's frames; every decode checked equal to its input."""
    stored = [encode(memoryview(data), plane) for data, plane in frames]
    dests = [bytearray(len(data)) for data, _ in frames]
    compress_s = _best_s(lambda: [encode(memoryview(data), plane) for data, plane in frames], repeats)
    decompress_s = _best_s(lambda: [decode(s, plane, memoryview(d)) for s, (_, plane), d in zip(stored, frames, dests)], repeats)
    if any(bytes(d) != data for d, (data, _) in zip(dests, frames)):
        raise SystemExit("a candidate's decode differs from its input")
    return _figures(frames, sum(len(s if isinstance(s, bytes) else s[1]) for s in stored), compress_s, decompress_s)


def _figures(frames: list[tuple[bytes, int]], stored_bytes: int, compress_s: float, decompress_s: float) -> dict:
    raw_mb = sum(len(data) for data, _ in frames) / 1e6
    ratio = raw_mb * 1e6 / max(1, stored_bytes)
    decompress_ms = decompress_s * 1000 / raw_mb
    return {
        "ratio": round(ratio, 4),
        "compress_ms_per_mb": round(compress_s * 1000 / raw_mb, 3),
        "decompress_ms_per_mb": round(decompress_ms, 3),
        # raw MB/s a reader gets when the stored bytes arrive at the bar and one core decodes them
        "read_mb_s": round(1000 / (1000 / (ratio * BAR_MB_S) + decompress_ms), 1),
    }


def measure_store(frames: list[tuple[bytes, int]], repeats: int) -> dict:
    """What the store's own codec does with the kind's frames (one entry per frame, as the store writes tensors:
    an opaque byte blob as :data:`~refsight.store._safetensors.OPAQUE_PLANE`-byte planes), checks and checksums included."""
    from refsight.store._safetensors import OPAQUE_PLANE
    from refsight.vllm_connector import refsight_codec

    planes = [(data, OPAQUE_PLANE if plane == 1 else plane) for data, plane in frames]

    def encode():
        return [b"".join(bytes(c) for c in refsight_codec.compress([(data, plane)]).chunks) for data, plane in planes]

    stored = encode()
    compress_s = _best_s(encode, repeats)
    decompress_s = _best_s(lambda: [refsight_codec.decompress(memoryview(s)) for s in stored], repeats)
    if any(bytes(refsight_codec.decompress(memoryview(s))) != data for s, (data, _) in zip(stored, frames)):
        raise SystemExit("the store's codec decoded other bytes")
    tables = [refsight_codec.frames(memoryview(s)) for s in stored]
    return {
        **_figures(frames, sum(len(s) for s in stored), compress_s, decompress_s),
        "kept_raw": sum(not table for table in tables),
        "byte_planes": sum(plane > 1 for table in tables for _, plane, *_ in table),
        "frames": len(stored),
    }


def choose(figures: dict[str, dict]) -> str:
    """The rule, read speed first: among candidates that encode at >= WRITE_FLOOR_MB_S, those whose ``read_mb_s`` is
    within READ_TIE of the best; then the best ratio of those. ``raw`` when that ratio is under the store's
    ``MIN_RATIO`` or no candidate reads faster than the raw bytes do (the bar)."""
    from refsight.vllm_connector.refsight_codec import MIN_RATIO

    writable = {name: f for name, f in figures.items() if f["compress_ms_per_mb"] <= 1000 / WRITE_FLOOR_MB_S}
    if not writable:
        return "raw"
    fastest = max(f["read_mb_s"] for f in writable.values())
    fast = [name for name, f in writable.items() if f["read_mb_s"] >= (1 - READ_TIE) * fastest]
    name = max(fast, key=lambda n: (writable[n]["ratio"], writable[n]["read_mb_s"]))
    return name if writable[name]["ratio"] >= MIN_RATIO and fastest > BAR_MB_S else "raw"


def overall(report: dict[str, dict]) -> str:
    """One codec for every kind (the store has one): the candidate with the least read time per MB at the bar,
    summed over the kinds (each kind counts once, whatever its size), among those that encode every kind at
    >= WRITE_FLOOR_MB_S."""
    names = set.intersection(*(set(entry["candidates"]) for entry in report.values()))
    writable = [n for n in names if all(e["candidates"][n]["compress_ms_per_mb"] <= 1000 / WRITE_FLOOR_MB_S
                                       for e in report.values())]
    # A machine too loaded for any candidate to write at the floor cannot rank them by it: read time alone decides.
    writable = writable or sorted(names)
    return min(writable, key=lambda n: sum(1 / e["candidates"][n]["read_mb_s"] for e in report.values()))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated model[:dtype] list")
    parser.add_argument("--size", type=int, default=448, help="edge of every (square) photo")
    parser.add_argument("--repeats", type=int, default=5)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Gather the kinds, measure every candidate on each, print the JSON line and return it."""
    args = _parser().parse_args(argv)
    kinds: dict[str, list] = defaultdict(list)
    random_weights = _model_kinds([m for m in args.models.split(",") if m], args.size, kinds)
    _real_kinds(args.size, kinds)
    every = candidates()
    report = {}
    for kind, items in sorted(kinds.items()):
        frames = [(data, plane) for data, plane, _ in items]
        figures = {name: measure(frames, encode, decode, args.repeats) for name, (encode, decode) in every.items()}
        report[kind] = {
            "mb": round(sum(len(data) for data, _ in frames) / 1e6, 3),
            "sources": sorted({source for *_, source in items}),
            "candidates": figures,
            "choice": choose(figures),
            "store": measure_store(frames, args.repeats),
        }
        _log(f"{kind}: {report[kind]['choice']} (store ratio {report[kind]['store']['ratio']})")
    figures = {
        "size": args.size, "repeats": args.repeats, "bar_mb_s": BAR_MB_S, "read_tie": READ_TIE,
        "write_floor_mb_s": WRITE_FLOOR_MB_S, "random_weights": random_weights, "kinds": report,
        "choices": {kind: entry["choice"] for kind, entry in report.items()},
        "overall": overall(report),
        "store": {kind: {k: entry["store"][k] for k in ("ratio", "read_mb_s", "decompress_ms_per_mb")}
                  for kind, entry in report.items()},
    }
    print(json.dumps(figures), flush=True)
    return figures


if __name__ == "__main__":
    main()
