"""How much does loading a stored package cost, compared with reading its bytes?

Writes packages of realistic size (1,369 tokens × 1,536 dims bf16 ≈ 4 MB, the
merged features of a Qwen2-VL image at ~1,000×1,000 px, and ≈ 10 MB), then
measures with a warm page cache, medians over repeats:

- ``raw_read_ms``: ``open(path, "rb").read()`` of the package file;
- ``disk_load_ms``: ``LocalPackageStore.get`` (index row, read, xxh3-128 checksum,
  header and spec checks, tensors as views of the read buffer);
- ``memory_load_ms``: a memory-tier hit through the tiered store;
- ``disk_ratio``: disk load / raw read, measured in alternation in the same run;
- ``index_lookup_us``: median ``contains()`` on an index of ``entries`` rows (half the
  probes present, half absent);
- ``checksum_ms``: xxh3-128 over the bytes just read by the plain read: the floor
  that any checked load pays on top of the read.

Everything goes through the store's public API (``open_store``, ``put`` / ``get`` /
``contains`` / ``path_for`` of its tiers): the lookup index is filled with real, tiny
packages, so the figures follow the store through any schema change.

Prints ONE JSON line. The figures of the first ``--sizes`` entry (4 MB by default) are the
top-level keys; ``sizes`` holds the figures of every size. Usage:
``python benchmarks/store_load.py [--repeats N] [--entries N] [--sizes 4mb,10mb]``
(``--sizes tiny``: a few KB, the smoke test's size).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import xxhash

from refsight.package import EncoderFingerprint, VisualPackage
from refsight.store import open_store

SIZES = {"4mb": (1369, 1536), "10mb": (3420, 1536), "tiny": (16, 64)}
#: Writers filling the lookup index at once: each put fsyncs its file outside the store's write lock.
FILL_THREADS = 8


def make(tokens: int, dims: int, n: int) -> VisualPackage:
    """A Qwen2-VL-like package; ``n`` makes the image hash (and so the key) unique."""
    fp = EncoderFingerprint(
        backend="bench", model_id="qwen2-vl-like", revision="r1", dtype="bfloat16", preprocessing={"max_pixels": 1003520}
    )
    g = torch.Generator().manual_seed(n)
    return VisualPackage(
        tensors={
            "features": torch.randn(tokens, dims, generator=g).to(torch.bfloat16),
            "image_grid_thw": torch.tensor([[1, 74, 74]]),
        },
        metadata={"image_grid_thw": [[1, 74, 74]], "num_tokens": tokens},
        image_sha256=f"{n:064x}",
        fingerprint=fp,
    )


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _pair(store, key: str, path: Path) -> tuple[float, float, float]:
    """One plain read, its checksum, and one checked store load of the same file: seconds each."""
    # Back to back, so both see the same machine load; the ratio is the median of the per-pair ratios.
    start = time.perf_counter()
    with open(path, "rb") as f:
        data = f.read()
    t_raw = time.perf_counter() - start
    # The checksum over the bytes just read: the floor any checked load pays on top of the
    # read (it is also the first time those bytes are touched by the process).
    start = time.perf_counter()
    xxhash.xxh3_128_hexdigest(data)
    t_hash = time.perf_counter() - start
    del data
    start = time.perf_counter()
    package = store.local.get(key)
    t_disk = time.perf_counter() - start
    assert package is not None
    return t_raw, t_hash, t_disk


def measure_size(store, tokens: int, dims: int, repeats: int) -> dict:
    packages = [make(tokens, dims, tokens * 100 + n) for n in range(4)]
    sizes = [store.packages.put(p) for p in packages]
    keys = [p.key for p in packages]
    paths = [store.local.path_for(k) for k in keys]
    for path in paths:  # warm the page cache
        path.read_bytes()
    pairs = [_pair(store, keys[i % len(keys)], paths[i % len(keys)]) for i in range(repeats)]
    raw, hashing, disk = (list(column) for column in zip(*pairs))
    store.memory.clear()
    store.packages.get(keys[0])  # promote into memory
    mem = []
    for _ in range(repeats * 10):
        start = time.perf_counter()
        hit = store.packages.get(keys[0])
        mem.append(time.perf_counter() - start)
    assert hit is not None
    return {
        "package_mb": round(sizes[0] / 1e6, 3),
        "raw_read_ms": round(median_ms(raw), 4),
        "disk_load_ms": round(median_ms(disk), 4),
        "memory_load_ms": round(median_ms(mem), 5),
        "disk_ratio": round(statistics.median(d / r for d, r in zip(disk, raw)), 3),
        "checksum_ms": round(median_ms(hashing), 4),
    }


def measure_lookup(store, entries: int, repeats: int) -> tuple[float, int]:
    """Median ``contains()`` in µs once the index holds ``entries`` rows (filled with tiny real packages)."""
    existing = len(list(store.local.keys()))
    fillers = [make(1, 8, 10**9 + n) for n in range(max(0, entries - existing))]
    with ThreadPoolExecutor(FILL_THREADS) as pool:
        list(pool.map(store.local.put, fillers))
    total = len(list(store.local.keys()))
    present = [p.key for p in random.sample(fillers, min(len(fillers), repeats))]
    probes = present + [f"{random.getrandbits(256):064x}" for _ in range(repeats)]
    samples = []
    for key in probes:
        start = time.perf_counter()
        store.local.contains(key)
        samples.append(time.perf_counter() - start)
    return round(statistics.median(samples) * 1e6, 2), total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--entries", type=int, default=10_000, help="rows in the index the lookups probe")
    parser.add_argument("--sizes", default="4mb,10mb", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--dir", type=Path, default=None, help="store directory (default: a temp dir)")
    args = parser.parse_args(argv)
    names = [n for n in args.sizes.split(",") if n]
    if not names or any(n not in SIZES for n in names):
        parser.error(f"--sizes takes names of {', '.join(SIZES)}")
    torch.set_num_threads(1)
    random.seed(0)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        with open_store(Path(tmp) / "store", memory_bytes=64 << 20) as store:
            sizes = {name: measure_size(store, *SIZES[name], args.repeats) for name in names}
            lookup_us, entries = measure_lookup(store, args.entries, args.repeats * 5)
    result = dict(sizes[names[0]])
    result["index_lookup_us"] = lookup_us
    result["entries"] = entries
    result["sizes"] = sizes
    result["cpu_count"] = os.cpu_count()
    result["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
