"""Helpers shared by the store tests and their subprocess workers: real packages from torch tensors."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable

import torch

from refsight.package import EncoderFingerprint, VisualPackage


def image_hash(n: int) -> str:
    """A stand-in image hash (the store treats it as an opaque sha256 hex)."""
    return hashlib.sha256(f"image-{n}".encode()).hexdigest()


def fingerprint(model: str = "tiny-vlm", **preprocessing) -> EncoderFingerprint:
    """A fingerprint like a real backend's: bf16 features, processor settings."""
    return EncoderFingerprint(
        backend="test", model_id=model, revision="rev-1", dtype="bfloat16", preprocessing=preprocessing or {"max_pixels": 448 * 448}
    )


def make_package(n: int, *, tokens: int = 16, dims: int = 32, model: str = "tiny-vlm") -> VisualPackage:
    """A Qwen-like package: bf16 features, deepstack layers, int64 grid, metadata."""
    g = torch.Generator().manual_seed(n)
    return VisualPackage(
        tensors={
            "features": torch.randn(tokens, dims, generator=g).to(torch.bfloat16),
            "deepstack.0": torch.randn(tokens, dims, generator=g).to(torch.bfloat16),
            "image_grid_thw": torch.tensor([[1, 2 * n + 2, 8]], dtype=torch.int64),
            "mask": torch.rand(tokens, generator=g) > 0.5,
        },
        metadata={"image_grid_thw": [[1, 2 * n + 2, 8]], "num_tokens": tokens, "note": f"package {n}"},
        image_sha256=image_hash(n),
        fingerprint=fingerprint(model),
        encode_ms=12.5 + n,
    )


def written_before_the_codec(store, key: str) -> bytes:
    """Turn the stored package ``key`` into what refsight wrote before its codec: the plain safetensors file
    (byte for byte the codec's raw form: ``_safetensors.encode``'s chunks, as that refsight's ``put`` wrote
    them) and a row naming that file's size and checksum. Returns the file's bytes."""
    from refsight.store._files import checksum
    from refsight.vllm_connector import refsight_codec

    path = store.local.path_for(key)
    raw = bytes(refsight_codec.decompress(memoryview(path.read_bytes())))
    path.write_bytes(raw)
    with store.local._db.write() as conn:
        conn.execute("UPDATE packages SET bytes = ?, checksum = ?, raw_bytes = ? WHERE key = ?",
                     (len(raw), checksum(raw), len(raw), key))
    return raw


def run_threads(work: Callable[[int], None], count: int = 4) -> list[BaseException]:
    """Run ``work(0)`` … ``work(count - 1)`` on threads at once; the exceptions they raised (a thread's would vanish)."""
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:  # surfaced to the caller's assert
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors
