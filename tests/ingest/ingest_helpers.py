"""Shared by the ingest tests: generated reference images and a snapshot of what a store holds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
from PIL import Image

MODEL = "tiny-smolvlm"


def make_images(directory: Path, count: int, *, size: int = 40, seed: int = 0) -> list[Path]:
    """``count`` distinct small PNGs (smooth colour fields plus noise), half of them one folder down."""
    rng = np.random.default_rng(seed)
    paths = []
    yy, xx = np.mgrid[0:size, 0:size] / size
    for i in range(count):
        base = rng.integers(0, 256, 3)
        slope = rng.integers(-120, 120, (2, 3))
        pixels = base + xx[..., None] * slope[0] + yy[..., None] * slope[1] + rng.normal(0, 12, (size, size, 3))
        folder = directory / ("sub" if i % 2 else "top")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"ref{i:04d}.png"
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path)
        paths.append(path)
    return paths


def stored_packages(store: Path) -> int:
    """How many package rows an embedded store's database holds right now (0 while it cannot be read)."""
    try:
        conn = sqlite3.connect(f"file:{store / 'refsight.db'}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute("SELECT count(*) FROM packages").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def snapshot(store: Path) -> dict[str, object]:
    """What a store holds, by name: package keys, references and links, kept images, vectors, records."""
    def rows(path: Path, sql: str) -> list[tuple]:
        if not path.exists():
            return []
        conn = sqlite3.connect(path)
        try:
            return sorted(conn.execute(sql).fetchall())
        finally:
            conn.close()

    db = store / "refsight.db"
    return {
        "packages": rows(db, "SELECT key, image_sha256 FROM packages"),
        "references": rows(db, 'SELECT namespace, ref_id, image_sha256, metadata FROM "references"'),
        "links": rows(db, "SELECT namespace, ref_id, fingerprint_digest, package_key FROM reference_packages"),
        "images": rows(db, "SELECT sha256, bytes FROM images"),
        "vectors": rows(store / "retrieval" / "vectors.sqlite", "SELECT embedder, image_sha256 FROM embeddings"),
        "entries": rows(store / "retrieval" / "vectors.sqlite", "SELECT embedder, namespace, ref_id, image_sha256 FROM entries"),
        "records": rows(store / "attributes" / "attributes.sqlite", "SELECT subject, source, schema FROM attributes"),
    }
