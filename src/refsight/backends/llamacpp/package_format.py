"""The llama.cpp visual package: per-chunk embeddings + chunk layout, and its fingerprint.

mtmd turns one image into an ordered list of chunks: one image chunk for
Qwen2/2.5/3-VL (M-RoPE positions derived from its ``nx × ny`` grid), several for
SmolVLM/Idefics3 (tiles + an overview, with row/column text between them). A
package keeps, in order:

* ``tensors``: ``image_chunk_000``, ``image_chunk_001``, ... float32
  ``[n_tokens, n_embd_inp]`` (what ``mtmd_get_output_embd`` returned);
* ``metadata``: ``image_size`` (the bitmap's width and height, all mtmd needs to
  rebuild the same chunk layout from a size-only placeholder), ``n_embd``, and
  ``chunks``: ``{"type": "image", "tensor", "n_tokens", "n_pos", "nx", "ny"}`` or
  ``{"type": "text", "tokens"}`` for the text mtmd put around and between them.

The fingerprint names the GGUF and mmproj by content (sha256, memoised per
``(path, size, mtime, inode)`` in and across processes), the llama-cpp-python build, and every setting that
changes the chunks (image min/max tokens, flash attention, device).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import CorruptPackageError
from ...package import EncoderFingerprint, VisualPackage
from .native import ChunkInfo

__all__ = ["file_sha256", "make_fingerprint", "chunks_metadata", "check_package", "image_chunk_layout", "tensor_name"]

#: Version of the layout above; part of every fingerprint.
LAYOUT_VERSION = 1

def file_sha256(path: str | os.PathLike) -> str:
    """``sha256:<hex>`` of a file's bytes; memoised per (path, size, mtime, inode), across processes too.

    GGUFs are gigabytes: the digest comes from refsight's shared file-hash memo
    (:mod:`refsight.backends.hf.hashing`, the same one local HF checkpoints use).
    """
    from ..hf.hashing import file_sha256 as shared_file_sha256

    return "sha256:" + shared_file_sha256(path)


#: ``general.file_type`` (llama.h's ``llama_ftype``) in the words Ollama reports it (``quantization_level``).
GGUF_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
}


def weights_of(parameter_count: int, file_type: str | None) -> dict[str, Any]:
    """A GGUF's :attr:`~refsight.backends.base.Backend.weights`: its parameter count and its file type's name."""
    kind = GGUF_FILE_TYPES.get(int(file_type)) if file_type is not None and file_type.isdigit() else None
    return {"parameter_count": parameter_count, **({"quantization": kind} if kind else {})}


def make_fingerprint(
    *,
    arch: str,
    model_id: str,
    model_sha256: str,
    mmproj_sha256: str,
    runtime_version: str,
    settings: dict[str, Any],
) -> EncoderFingerprint:
    """The fingerprint of a llama.cpp backend (``backend="llamacpp-<arch>"``: never shared with HF keys)."""
    # The revision covers both files: mtmd needs the language model too (it checks
    # the embedding size and tokenizes the text between chunks with its vocabulary).
    revision = "sha256:" + hashlib.sha256(f"{model_sha256}\n{mmproj_sha256}".encode()).hexdigest()
    return EncoderFingerprint(
        backend=f"llamacpp-{arch}",
        model_id=model_id,
        revision=revision,
        dtype="float32",  # mtmd always hands out float32 embeddings
        preprocessing={
            "gguf_sha256": model_sha256,
            "mmproj_sha256": mmproj_sha256,
            "llama_cpp_python": runtime_version,
            "layout": LAYOUT_VERSION,
            **settings,
        },
    )


def tensor_name(index: int) -> str:
    """The tensor name of the ``index``-th image chunk of a package."""
    return f"image_chunk_{index:03d}"


def chunks_metadata(chunks: Sequence[ChunkInfo]) -> list[dict[str, Any]]:
    """The ``chunks`` metadata list of one image's own tokenization (text and image chunks, in order)."""
    out: list[dict[str, Any]] = []
    k = 0
    for info in chunks:
        if info.kind == "image":
            out.append(
                {"type": "image", "tensor": tensor_name(k), "n_tokens": info.n_tokens, "n_pos": info.n_pos,
                 "nx": info.nx, "ny": info.ny}
            )
            k += 1
        else:
            out.append({"type": "text", "tokens": list(info.tokens)})
    return out


def image_chunk_layout(chunks: Sequence[ChunkInfo | dict[str, Any]]) -> list[tuple[int, int, int, int]]:
    """``(n_tokens, n_pos, nx, ny)`` of each image chunk, in order (from ChunkInfo or metadata)."""
    layout = []
    for c in chunks:
        if isinstance(c, dict):
            if c.get("type") == "image":
                layout.append((int(c["n_tokens"]), int(c["n_pos"]), int(c["nx"]), int(c["ny"])))
        elif c.kind == "image":
            layout.append((c.n_tokens, c.n_pos, c.nx, c.ny))
    return layout


def check_package(package: VisualPackage, n_embd: int) -> None:
    """Raise :class:`CorruptPackageError` unless tensors and chunk metadata agree with each other and the model."""
    try:
        images = _image_chunks(package.metadata, n_embd)
        names = [c["tensor"] for c in images]
        if sorted(names) != sorted(package.tensors) or names != [tensor_name(i) for i in range(len(names))]:
            raise ValueError(f"tensors {sorted(package.tensors)} do not match the chunks {names}")
        for c in images:
            _check_tensor(c, package.tensors[c["tensor"]], n_embd)
    except CorruptPackageError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptPackageError(package.key, f"malformed llama.cpp package: {type(e).__name__}: {e}") from None


def _image_chunks(meta: dict[str, Any], n_embd: int) -> list[dict[str, Any]]:
    """The metadata's image chunks, once its image size and embedding width are checked."""
    width, height = (int(v) for v in meta["image_size"])
    images = [c for c in meta["chunks"] if c.get("type") == "image"]
    if width < 1 or height < 1 or not images:
        raise ValueError("no image size or no image chunk")
    if int(meta["n_embd"]) != n_embd:
        raise ValueError(f"n_embd {meta['n_embd']} but the model takes {n_embd}")
    return images


def _check_tensor(chunk: dict[str, Any], tensor: Any, n_embd: int) -> None:
    """One image chunk's tensor: float32, one row of ``n_embd`` per token."""
    if str(tensor.dtype).removeprefix("torch.") != "float32":
        raise ValueError(f"{chunk['tensor']} is {tensor.dtype}, not float32")
    if list(tensor.shape) != [int(chunk["n_tokens"]), n_embd]:
        raise ValueError(f"{chunk['tensor']} has shape {list(tensor.shape)}, expected [{chunk['n_tokens']}, {n_embd}]")


def embeddings(package: VisualPackage) -> list[np.ndarray]:
    """The image chunks' embeddings as float32 numpy arrays, in chunk order (no copy when possible)."""
    out = []
    for c in package.metadata["chunks"]:
        if c.get("type") == "image":
            tensor = package.tensors[c["tensor"]]
            out.append(tensor.numpy() if hasattr(tensor, "numpy") else np.asarray(tensor, dtype=np.float32))
    return out
