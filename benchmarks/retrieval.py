"""Benchmark the retrieval index: build time, single-threaded query latency, recall@k, memory.

    python benchmarks/retrieval.py --n 200000 --dim 512 [--k 10] [--queries 1000]
                                   [--library usearch|faiss|hnswlib] [--dtype f32|f16|i8]

Data: synthetic *clustered* unit vectors shaped like real embeddings, not uniform noise
(uniform noise in 512-d has no near neighbours, so every index looks equally bad and the
figures mean nothing). Each vector is a cluster centre plus a low-rank offset with a decaying
spectrum (most variance in a few dozen directions, as in real embedding sets) plus a little
isotropic noise, then L2-normalised. Queries are fresh draws from the same mixture.

Recall@k is measured against exact (brute-force inner product) search over the same vectors
in the same run. Latency is per query, one thread, one query at a time (the interactive case).
``--library usearch`` (the default) measures refsight's own index code
(:mod:`refsight.retrieval.index`); faiss and hnswlib are the comparison points.

Prints ONE JSON line:
``{"n", "dim", "build_s", "p50_ms", "p99_ms", "recall_at_10", "bytes_per_vector", "exact_p50_ms", "library", ...}``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def clustered_unit_vectors(n: int, dim: int, *, clusters: int, rank: int, seed: int) -> np.ndarray:
    """``n`` unit vectors from a mixture of ``clusters`` low-rank Gaussian blobs (float32)."""
    rng = np.random.default_rng(seed)
    # the mixture (centres, bases, spectrum) comes from a fixed seed so data and queries share it
    mix = np.random.default_rng(12345)
    centres = mix.standard_normal((clusters, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    basis = mix.standard_normal((rank, dim)).astype(np.float32) / np.sqrt(dim)
    spectrum = (1.0 / np.arange(1, rank + 1) ** 0.7).astype(np.float32)
    out = np.empty((n, dim), np.float32)
    step = 100_000
    for s in range(0, n, step):
        m = min(step, n - s)
        which = rng.integers(0, clusters, m)
        z = rng.standard_normal((m, rank)).astype(np.float32) * spectrum
        x = centres[which] + 0.9 * (z @ basis) + 0.02 * rng.standard_normal((m, dim)).astype(np.float32)
        out[s : s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def exact_top_k(data: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Ground truth by brute force, in chunks so the score matrix stays small."""
    out = np.empty((len(queries), k), np.int64)
    for s in range(0, len(queries), 64):
        scores = queries[s : s + 64] @ data.T
        idx = np.argpartition(-scores, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, idx, 1), axis=1)
        out[s : s + 64] = np.take_along_axis(idx, order, 1)
    return out


RESCORE = 3  # candidates per result fetched from a quantised index, as in VectorIndex


def _rescorer(data: np.ndarray, tmp: str):
    """Rescore candidates with float32 vectors read from a memory-mapped file (like the DB copy)."""
    path = os.path.join(tmp, "vectors.f32")
    data.tofile(path)
    mm = np.memmap(path, dtype=np.float32, mode="r", shape=data.shape)

    def rescore(q: np.ndarray, cand: np.ndarray, k: int) -> np.ndarray:
        cand = np.sort(cand[cand >= 0])  # sorted reads are friendlier to the page cache
        scores = np.asarray(mm[cand]) @ q
        return cand[np.argsort(-scores)[:k]]

    return rescore


def _timed(queries, k, fetch, search, rescore):
    lat, found = [], []
    for q in queries:
        t = time.perf_counter()
        cand = np.asarray(search(q, fetch), np.int64)
        top = rescore(q, cand, k) if rescore else cand[:k]
        lat.append(time.perf_counter() - t)
        found.append(top)
    return lat, found


def run_refsight(data, queries, k, dtype, ef, tmp):
    from refsight.retrieval.index import AnnIndex

    t0 = time.perf_counter()
    index = AnnIndex(data.shape[1], dtype=dtype)
    index.add(np.arange(len(data), dtype=np.uint64), data)
    build_s = time.perf_counter() - t0
    if ef:
        index.expansion_search = ef
    path = Path(tmp) / "bench.usearch"
    index.save(path)
    nbytes = path.stat().st_size
    quantised = dtype != "f32"
    fetch = k * RESCORE if quantised else k
    lat, found = _timed(queries, k, fetch, lambda q, n: index.search(q, n)[0], _rescorer(data, tmp) if quantised else None)
    return build_s, lat, found, nbytes, {"dtype": dtype, "expansion_search": index.expansion_search, "rescored_from": fetch if quantised else None,
                                          # the float32 copy used for rescoring lives on disk (vector DB), not in the index
                                          "disk_f32_bytes_per_vector": 4 * data.shape[1] if quantised else 0}


def run_faiss(data, queries, k, dtype, ef, tmp):
    import faiss

    d = data.shape[1]
    t0 = time.perf_counter()
    if dtype == "f32":
        index = faiss.IndexHNSWFlat(d, 16, faiss.METRIC_INNER_PRODUCT)
    else:
        qt = {"f16": faiss.ScalarQuantizer.QT_fp16, "i8": faiss.ScalarQuantizer.QT_8bit}[dtype]
        index = faiss.IndexHNSWSQ(d, qt, 16, faiss.METRIC_INNER_PRODUCT)
        index.train(data[:100_000])
    index.hnsw.efConstruction = 128
    index.add(data)
    build_s = time.perf_counter() - t0
    index.hnsw.efSearch = ef or 96
    nbytes = len(faiss.serialize_index(index))
    faiss.omp_set_num_threads(1)
    quantised = dtype != "f32"
    fetch = k * RESCORE if quantised else k
    lat, found = _timed(queries, k, fetch, lambda q, n: index.search(q[None, :], n)[1][0], _rescorer(data, tmp) if quantised else None)
    return build_s, lat, found, nbytes, {"dtype": dtype, "ef_search": index.hnsw.efSearch}


def run_hnswlib(data, queries, k, dtype, ef, tmp):
    import hnswlib

    if dtype != "f32":
        raise SystemExit("hnswlib stores float32 only")
    t0 = time.perf_counter()
    index = hnswlib.Index(space="ip", dim=data.shape[1])
    index.init_index(max_elements=len(data), M=16, ef_construction=128)
    index.add_items(data, np.arange(len(data)))
    build_s = time.perf_counter() - t0
    index.set_ef(ef or 96)
    index.set_num_threads(1)
    path = os.path.join(tmp, "bench.hnsw")
    index.save_index(path)
    nbytes = os.path.getsize(path)
    lat, found = _timed(queries, k, k, lambda q, n: index.knn_query(q[None, :], n)[0][0], None)
    return build_s, lat, found, nbytes, {"dtype": dtype, "ef": ef or 96}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--library", choices=("usearch", "faiss", "hnswlib"), default="usearch")
    parser.add_argument("--dtype", choices=("f32", "f16", "i8"), default="i8")
    parser.add_argument("--ef", type=int, default=0, help="search expansion (0: the library/refsight default)")
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--rank", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.n < args.k or args.dim < 2 or args.queries < 1:
        parser.error("need --n >= --k, --dim >= 2 and --queries >= 1")

    data = clustered_unit_vectors(args.n, args.dim, clusters=args.clusters, rank=args.rank, seed=args.seed)
    queries = clustered_unit_vectors(args.queries, args.dim, clusters=args.clusters, rank=args.rank, seed=args.seed + 1)
    truth = exact_top_k(data, queries, args.k)

    exact_lat = []
    for q in queries[: min(50, len(queries))]:
        t = time.perf_counter()
        scores = data @ q
        np.argpartition(-scores, args.k)[: args.k]
        exact_lat.append(time.perf_counter() - t)

    runner = {"usearch": run_refsight, "faiss": run_faiss, "hnswlib": run_hnswlib}[args.library]
    with tempfile.TemporaryDirectory() as tmp:
        build_s, lat, found, nbytes, params = runner(data, queries, args.k, args.dtype, args.ef, tmp)
    recall = float(np.mean([len(set(map(int, f[: args.k])) & set(map(int, t))) / args.k for f, t in zip(found, truth)]))
    lat_ms = np.asarray(lat) * 1000
    result = {
        "n": args.n,
        "dim": args.dim,
        "build_s": round(build_s, 2),
        "p50_ms": round(float(np.percentile(lat_ms, 50)), 3),
        "p99_ms": round(float(np.percentile(lat_ms, 99)), 3),
        f"recall_at_{args.k}": round(recall, 4),
        "bytes_per_vector": round(nbytes / args.n, 1),
        "exact_p50_ms": round(float(np.percentile(np.asarray(exact_lat) * 1000, 50)), 3),
        "library": args.library,
        **params,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
