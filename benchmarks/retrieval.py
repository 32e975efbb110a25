"""Benchmark the retrieval index: build time, single-threaded query latency, recall@k, memory.

    python benchmarks/retrieval.py --n 200000 --dim 512 [--k 10] [--queries 1000]
                                   [--library refsight|usearch|faiss|hnswlib] [--dtype f32|f16|i8]
                                   [--ef 96,128] [--connectivity 32] [--expansion-add 200]

Data: synthetic *clustered* unit vectors shaped like real embeddings, not uniform noise
(uniform noise in 512-d has no near neighbours, so every index looks equally bad and the
figures mean nothing). Each vector is a cluster centre plus a low-rank offset with a decaying
spectrum (most variance in a few dozen directions, as in real embedding sets) plus a little
isotropic noise, then L2-normalised. Queries are fresh draws from the same mixture.

Recall@k is measured against exact (brute-force inner product) search over the same vectors
in the same run. Latency is per query, one thread, one query at a time (the interactive case).
``--library refsight`` (the default) measures refsight's own index code
(:mod:`refsight.retrieval.ann`, hnswlib float32, exact scores); usearch (int8 by default, its
candidates rescored exactly), faiss and raw hnswlib are the comparison points.

Several ``--ef`` values are measured on one build (a 1M build takes ~25 minutes on 2 cores);
the first gives the top-level figures and all of them are listed under ``"sweep"``.

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


RESCORE = 3  # candidates per result fetched from a quantised index, then rescored exactly


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


class Built:
    """One built index: its build time and size, and how to search it at a given breadth."""

    def __init__(self, build_s, nbytes, params, set_ef, search, fetch, rescore):
        self.build_s, self.nbytes, self.params = build_s, nbytes, params
        self.set_ef, self.search, self.fetch, self.rescore = set_ef, search, fetch, rescore


def _stored_vectors(dimensions: int):
    """An embedder for vectors that are already known: the benchmark only searches stored vectors."""
    from refsight.embedders.base import Embedder

    class StoredVectors(Embedder):
        name = "stored-vectors"
        dim = dimensions

        def fingerprint(self):
            return {"model": "benchmark", "dim": self.dim}

        def _embed_images(self, images):
            raise RuntimeError("the benchmark only searches stored vectors")

        _embed_texts = _embed_images

    return StoredVectors()


class StorePath:
    """refsight's whole search path over the same vectors: ``Retriever.search_vector``.

    The vectors go into a real retrieval database through the retriever's own API (the vector
    cache, one entry per reference) and the retriever builds its graph from them, as
    ``refsight index`` does; a search then costs what it costs a user: the change check, the
    graph, rescoring from the database's float32 copy, the liveness check that maps labels to
    reference ids. ``load_s`` is that load and build.
    """

    CHUNK = 50_000

    def __init__(self, data: np.ndarray, tmp: str):
        from refsight.retrieval import Retriever

        self.root, self.embedder = Path(tmp) / "store", _stored_vectors(data.shape[1])
        t0 = time.perf_counter()
        with Retriever(self.root, self.embedder) as retriever:
            digest = retriever.embedder.digest
            for s in range(0, len(data), self.CHUNK):
                retriever.db.put_vectors(digest, {f"{i:064x}": data[i] for i in range(s, min(s + self.CHUNK, len(data)))})
            for i, vector in enumerate(data):
                retriever.add_vector(f"r{i}", f"{i:064x}", vector)
            retriever.rebuild()  # the graph from the database, no model
        self.load_s = time.perf_counter() - t0

    def measure(self, queries: np.ndarray, k: int, ef: int) -> tuple[list[float], list[np.ndarray]]:
        """Latency and results of ``search_vector`` at search breadth ``ef`` (the saved graph, reopened)."""
        from refsight.retrieval import Retriever

        with Retriever(self.root, self.embedder, expansion_search=ef) as retriever:
            retriever.search_vector(queries[0], 1)  # open: load the graph, reconcile with the database
            lat, found = [], []
            for q in queries:
                t = time.perf_counter()
                hits = retriever.search_vector(q, k)
                lat.append(time.perf_counter() - t)
                found.append(np.asarray([int(ref_id[1:]) for ref_id, _ in hits], np.int64))
        return lat, found


def build_refsight(data, k, dtype, graph, tmp):
    from refsight.retrieval.ann import AnnIndex

    t0 = time.perf_counter()
    index = AnnIndex(data.shape[1], capacity=len(data), **graph)
    index.add(np.arange(1, len(data) + 1, dtype=np.uint64), data)
    build_s = time.perf_counter() - t0
    path = Path(tmp) / "bench.bin"
    index.save(path)

    def set_ef(ef):
        index.expansion_search = ef
        return index.expansion_search

    # float32 in the graph: its scores are exact, nothing to rescore
    return Built(build_s, path.stat().st_size, {"dtype": "f32", **graph}, set_ef,
                 lambda q, n: index.search(q, n)[0] - 1, k, None)


def build_usearch(data, k, dtype, graph, tmp):
    from usearch.index import Index

    t0 = time.perf_counter()
    index = Index(ndim=data.shape[1], metric="ip", dtype=dtype, **graph)
    index.add(np.arange(len(data), dtype=np.uint64), data, threads=0)
    build_s = time.perf_counter() - t0
    path = os.path.join(tmp, "bench.usearch")
    index.save(path)
    quantised = dtype != "f32"

    def set_ef(ef):
        index.expansion_search = ef
        return ef

    params = {"dtype": dtype, **graph, "rescored_from": k * RESCORE if quantised else None}
    return Built(build_s, os.path.getsize(path), params, set_ef,
                 lambda q, n: index.search(q, n, threads=1).keys.astype(np.int64),
                 k * RESCORE if quantised else k, _rescorer(data, tmp) if quantised else None)


def build_faiss(data, k, dtype, graph, tmp):
    import faiss

    d, m = data.shape[1], graph["connectivity"]
    t0 = time.perf_counter()
    if dtype == "f32":
        index = faiss.IndexHNSWFlat(d, m, faiss.METRIC_INNER_PRODUCT)
    else:
        qt = {"f16": faiss.ScalarQuantizer.QT_fp16, "i8": faiss.ScalarQuantizer.QT_8bit}[dtype]
        index = faiss.IndexHNSWSQ(d, qt, m, faiss.METRIC_INNER_PRODUCT)
        index.train(data[:100_000])
    index.hnsw.efConstruction = graph["expansion_add"]
    index.add(data)
    build_s = time.perf_counter() - t0
    nbytes = len(faiss.serialize_index(index))
    faiss.omp_set_num_threads(1)
    quantised = dtype != "f32"

    def set_ef(ef):
        index.hnsw.efSearch = ef
        return ef

    return Built(build_s, nbytes, {"dtype": dtype, **graph}, set_ef, lambda q, n: index.search(q[None, :], n)[1][0],
                 k * RESCORE if quantised else k, _rescorer(data, tmp) if quantised else None)


def build_hnswlib(data, k, dtype, graph, tmp):
    import hnswlib

    if dtype != "f32":
        raise SystemExit("hnswlib stores float32 only")
    t0 = time.perf_counter()
    index = hnswlib.Index(space="ip", dim=data.shape[1])
    index.init_index(max_elements=len(data), M=graph["connectivity"], ef_construction=graph["expansion_add"])
    index.add_items(data, np.arange(len(data)))
    build_s = time.perf_counter() - t0
    index.set_num_threads(1)
    path = os.path.join(tmp, "bench.hnsw")
    index.save_index(path)

    def set_ef(ef):
        index.set_ef(ef)
        return ef

    return Built(build_s, os.path.getsize(path), {"dtype": dtype, **graph}, set_ef,
                 lambda q, n: index.knn_query(q[None, :], n)[0][0], k, None)


def _ef_list(text: str) -> list[int]:
    """``"48,64,96"`` -> ``[48, 64, 96]``; ``"0"`` means refsight's default breadth."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ef wants comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"--ef wants non-negative integers, got {text!r}")
    return values


def _figures(lat, found, truth, k) -> dict:
    recall = float(np.mean([len(set(map(int, f[:k])) & set(map(int, t))) / k for f, t in zip(found, truth)]))
    lat_ms = np.asarray(lat) * 1000
    return {
        "p50_ms": round(float(np.percentile(lat_ms, 50)), 3),
        "p99_ms": round(float(np.percentile(lat_ms, 99)), 3),
        f"recall_at_{k}": round(recall, 4),
    }


def _parser() -> argparse.ArgumentParser:
    from refsight.retrieval.index import DEFAULT_GRAPH

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--library", choices=("refsight", "usearch", "faiss", "hnswlib"), default="refsight")
    parser.add_argument("--dtype", choices=("f32", "f16", "i8"), default="i8",
                        help="storage of the usearch and faiss graphs (refsight and hnswlib store float32)")
    parser.add_argument("--ef", type=_ef_list, default=[0],
                        help="search breadth, or several comma-separated ones measured on ONE build "
                             "(the first gives the top-level figures; 0: refsight's default)")
    parser.add_argument("--connectivity", type=int, default=DEFAULT_GRAPH["connectivity"], help="HNSW graph degree (M)")
    parser.add_argument("--expansion-add", type=int, default=DEFAULT_GRAPH["expansion_add"], help="build breadth")
    parser.add_argument("--index-only", action="store_true",
                        help="skip the store path (Retriever.search_vector over a real retrieval database)")
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--rank", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def _exact_p50_ms(data: np.ndarray, queries: np.ndarray, k: int) -> float:
    """Median brute-force query time over the first 50 queries (the baseline an index must beat)."""
    lat = []
    for q in queries[: min(50, len(queries))]:
        t = time.perf_counter()
        np.argpartition(-(data @ q), k)[:k]
        lat.append(time.perf_counter() - t)
    return round(float(np.percentile(np.asarray(lat) * 1000, 50)), 3)


def _sweep(args, data, queries, truth, tmp) -> tuple[Built, list[dict], StorePath | None]:
    """Build once, measure every ``--ef`` on the graph and (refsight's own index) on the store path."""
    from refsight.retrieval.index import DEFAULT_GRAPH, EXACT_THRESHOLD

    builder = {"refsight": build_refsight, "usearch": build_usearch, "faiss": build_faiss, "hnswlib": build_hnswlib}[args.library]
    graph = {"connectivity": args.connectivity, "expansion_add": args.expansion_add}
    built = builder(data, args.k, args.dtype, graph, tmp)
    sweep = []
    for ef in args.ef:
        ef = built.set_ef(ef or DEFAULT_GRAPH["expansion_search"])
        lat, found = _timed(queries, args.k, built.fetch, built.search, built.rescore)
        sweep.append({"expansion_search": ef, **_figures(lat, found, truth, args.k)})
    store = None
    if args.library == "refsight" and not args.index_only and args.n >= EXACT_THRESHOLD:
        store = StorePath(data, tmp)
        for entry in sweep:
            lat, found = store.measure(queries, args.k, entry["expansion_search"])
            entry.update({f"store_{key}": value for key, value in _figures(lat, found, truth, args.k).items()})
    return built, sweep, store


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its JSON line."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.n < args.k or args.dim < 2 or args.queries < 1:
        parser.error("need --n >= --k, --dim >= 2 and --queries >= 1")
    data = clustered_unit_vectors(args.n, args.dim, clusters=args.clusters, rank=args.rank, seed=args.seed)
    queries = clustered_unit_vectors(args.queries, args.dim, clusters=args.clusters, rank=args.rank, seed=args.seed + 1)
    truth = exact_top_k(data, queries, args.k)
    with tempfile.TemporaryDirectory() as tmp:
        built, sweep, store = _sweep(args, data, queries, truth, tmp)
    first = sweep[0]
    result = {
        "n": args.n,
        "dim": args.dim,
        "build_s": round(built.build_s, 2),
        "p50_ms": first["p50_ms"],
        "p99_ms": first["p99_ms"],
        f"recall_at_{args.k}": first[f"recall_at_{args.k}"],
        "bytes_per_vector": round(built.nbytes / args.n, 1),
        "exact_p50_ms": _exact_p50_ms(data, queries, args.k),
        "library": args.library,
        "expansion_search": first["expansion_search"],
        **built.params,
    }
    if store is not None:
        result.update({key: first[key] for key in first if key.startswith("store_")})
        result["store_load_s"] = round(store.load_s, 2)
    if len(sweep) > 1:
        result["sweep"] = sweep
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
