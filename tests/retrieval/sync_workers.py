"""A subprocess worker for the index-convergence tests (run as ``python sync_workers.py ROOT CATALOG LOCAL ...``).

Each worker opens the store (SQLite, or a PostgreSQL catalog with its own replica directory),
follows the catalog with a :class:`~refsight.retrieval.store_index.StoreIndex`, and from several
threads adds, re-describes and removes references from one small pool of ids that every worker
shares, searching between the writes (each search syncs). When told ``check`` it prints, as JSON,
the ids a search of the whole namespace returns, and the ids the catalog lists.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

from refsight.errors import InvalidInputError, ReferenceNotFoundError
from refsight.inputs.images import load_image
from refsight.embedders.base import Embedder
from refsight.retrieval.store_index import StoreIndex
from refsight.store import open_store

NAMESPACE = "tenant"
POOL = 24  # ids every worker adds and removes
IMAGES = 40  # distinct images the adds draw from
DIM = 16


class HashEmbedder(Embedder):
    """A random unit vector seeded by the image's hash: distinct per image, no model (orchestration only)."""

    name = "hash-16"

    @property
    def dim(self) -> int:
        return DIM

    def fingerprint(self) -> dict:
        return {"model": "hash-16", "revision": "1"}

    def _embed_images(self, images):
        return np.stack([_vector(image.sha256) for image in images])

    def _embed_texts(self, texts, instruction):
        return np.ones((len(texts), DIM), np.float32)


def _vector(seed_text: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(seed_text.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


def image_bytes(n: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (n * 5 % 256, n * 11 % 256, n * 17 % 256)).save(buffer, format="PNG")
    return buffer.getvalue()


def everything(index: StoreIndex) -> list[str]:
    """Every reference a search of the namespace returns (k above the pool: the whole index)."""
    found = index.search(text=None, image=None, k=1000, namespace=NAMESPACE, vector=np.ones(DIM, np.float32) / 4)
    return sorted(hit.ref_id for hit in found.hits)


def one_step(store, index: StoreIndex, rng: random.Random, images: list) -> None:
    """Add, re-describe or remove one id of the shared pool, then search (which syncs)."""
    catalog = store.catalog
    ref_id = f"ref-{rng.randrange(POOL)}"
    try:
        existing = catalog.get_reference(ref_id, namespace=NAMESPACE)
    except ReferenceNotFoundError:
        existing = None
    try:
        if existing is None:
            data, image = images[rng.randrange(IMAGES)]
            catalog.ingest_reference(ref_id, image.sha256, data, "PNG", {"n": rng.randrange(3)}, namespace=NAMESPACE)
        elif rng.random() < 0.25:
            catalog.add_reference(ref_id, existing.image_sha256, {"n": rng.randrange(3)}, namespace=NAMESPACE)
        else:
            catalog.remove_reference(ref_id, namespace=NAMESPACE)
            index.forget(NAMESPACE, ref_id)  # what the engine's removal listener does
    except (ReferenceNotFoundError, InvalidInputError):
        pass  # another writer got there first: the race this test is about
    everything(index)


def main(root: str, catalog_url: str, local_dir: str, seed: int, rounds: int, threads: int) -> None:
    store = open_store(root, catalog=catalog_url or None, local_dir=local_dir or None)
    images = [(data, load_image(data)) for data in map(image_bytes, range(IMAGES))]
    kept = {image.sha256: image for _, image in images}
    index = StoreIndex(store.derived_root, store.catalog, lambda row: kept[row.image_sha256], embedder=HashEmbedder())
    everything(index)  # the embedder and retriever are ready before the race starts
    print("READY", flush=True)
    assert sys.stdin.readline().strip() == "go"

    def work(thread: int) -> None:
        rng = random.Random(seed * 100 + thread)
        for _ in range(rounds):
            one_step(store, index, rng, images)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(threads)))  # a thread's exception is raised here
    print("DONE", flush=True)
    assert sys.stdin.readline().strip() == "check"
    listed = sorted(r.ref_id for r in store.catalog.list_references(namespace=NAMESPACE))
    print(json.dumps({"searched": everything(index), "listed": listed}), flush=True)
    index.close()
    store.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
