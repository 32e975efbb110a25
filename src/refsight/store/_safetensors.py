"""Read and write the safetensors format without extra copies.

Format (https://github.com/huggingface/safetensors): 8-byte little-endian header
length N, N bytes of JSON (``{"__metadata__": {str: str}, name: {"dtype", "shape",
"data_offsets": [begin, end]}}``, padded with spaces to 8 bytes), then the tensor
bytes back to back. Files written here load with ``safetensors.torch.load_file``; the store
keeps them in the codec's stored form (:func:`compress_file`, :mod:`refsight.vllm_connector.refsight_codec`),
which decompresses to exactly them.

Writing streams each tensor's own memory (no joined buffer); reading builds every
tensor as a view of the one buffer that was read from disk (no second copy). torch
is imported inside the functions so that ``import refsight`` stays light.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from ..vllm_connector.refsight_codec import Compressed, compress

__all__ = [
    "prepare", "encode", "compress_file", "decode", "describe", "read_buffer", "SafetensorsFormatError", "Layout",
    "OPAQUE_PLANE",
]

if sys.byteorder != "little":  # pragma: no cover - every platform refsight targets is little-endian
    raise ImportError("refsight's package store needs a little-endian machine (safetensors is little-endian)")

_ALIGN = 8
_MAX_HEADER = 100 * 1024 * 1024

# safetensors dtype code -> torch dtype attribute name
_CODES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "C64": "complex64",
}
#: Bytes per element of each dtype code (the layout checks need no torch).
_ITEMSIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "C64": 8,
}


class SafetensorsFormatError(ValueError):
    """The bytes are not a well-formed safetensors file (the caller turns this into its own error)."""


@functools.cache
def _dtype_tables() -> tuple[dict[Any, str], dict[str, Any]]:
    import torch

    to_code = {}
    from_code = {}
    for code, name in _CODES.items():
        dtype = getattr(torch, name, None)
        if dtype is not None:
            to_code[dtype] = code
            from_code[code] = dtype
    return to_code, from_code


def prepare(tensors: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Check ``tensors`` and order them for :func:`encode`; raises :class:`SafetensorsFormatError`.

    Tensors are laid out by decreasing element size, then name, so that every
    tensor starts at an offset aligned to its element size (as the reference
    implementation does) and the views built on read are aligned.
    """
    import torch

    to_code, _ = _dtype_tables()
    prepared = []
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise SafetensorsFormatError(f"invalid tensor name {name!r}")
        if isinstance(tensor, (bytes, bytearray, memoryview)):
            # An opaque blob (a llama.cpp sequence state) is kept as one uint8 tensor.
            data = bytearray(memoryview(tensor).cast("B"))
            tensor = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        if not isinstance(tensor, torch.Tensor):
            raise SafetensorsFormatError(f"tensor {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
        if tensor.dtype not in to_code:
            raise SafetensorsFormatError(f"tensor {name!r} has dtype {tensor.dtype}, which safetensors cannot hold")
        if tensor.layout != torch.strided:
            raise SafetensorsFormatError(f"tensor {name!r} is {tensor.layout}; only dense tensors are stored")
        prepared.append((name, tensor.detach().to("cpu").contiguous()))
    prepared.sort(key=lambda item: (-item[1].element_size(), item[0]))
    return prepared


def encode(prepared: list[tuple[str, Any]], metadata: Mapping[str, str]) -> list[Any]:
    """The file as a list of chunks: header bytes, then each tensor's own memory (no copy).

    ``prepared`` comes from :func:`prepare`.
    """
    import torch

    to_code, _ = _dtype_tables()
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    chunks: list[Any] = []
    offset = 0
    for name, tensor in prepared:
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": to_code[tensor.dtype],
            "shape": [int(s) for s in tensor.shape],
            "data_offsets": [offset, offset + size],
        }
        if size:
            # A uint8 view of the tensor's own memory: no copy, works for bf16 (numpy has no bf16).
            chunks.append(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
        offset += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode()
    text += b" " * (-len(text) % _ALIGN)
    return [len(text).to_bytes(8, "little") + text, *chunks]


#: Byte planes of an opaque ``uint8`` blob (a llama.cpp sequence state: mostly f16 KV cells).
OPAQUE_PLANE = 2


def compress_file(prepared: list[tuple[str, Any]], metadata: Mapping[str, str]) -> Compressed:
    """The safetensors file of ``prepared`` (:func:`prepare`) in the codec's stored form.

    Frames: the header, then each tensor's bytes with its element size as the byte planes (an opaque
    ``uint8`` blob: :data:`OPAQUE_PLANE`).
    """
    chunks = encode(prepared, metadata)
    planes = [1] + [
        OPAQUE_PLANE if str(tensor.dtype) == "torch.uint8" else tensor.element_size()
        for _, tensor in prepared if tensor.numel()
    ]
    return compress(zip(chunks, planes, strict=True))


def read_buffer(path: str | os.PathLike, size: int) -> Any:
    """Map exactly ``size`` bytes of ``path`` as a private, writable buffer.

    Returns a memoryview of exactly ``size`` bytes. The tensors :func:`decode`
    returns are views of this one mapping, so the file's bytes are never copied:
    pages come from the page cache as they are first touched (by the checksum),
    and a write to a tensor makes a private copy of that page, never touching the
    file (copy-on-write). Measured on a warm page cache, this costs ~1.6x a plain
    ``f.read()`` of the file *including* the checksum, against ~2x for reading into
    a fresh buffer. Files are only ever replaced by rename, never truncated in
    place, so a mapping stays valid for as long as a tensor uses it. Raises
    ``ValueError`` when the file is shorter or longer than ``size``.
    """
    import mmap

    with open(path, "rb", buffering=0) as f:
        actual = os.fstat(f.fileno()).st_size
        if actual != size:
            raise ValueError(f"file has {actual} bytes, the index says {size}")
        if size == 0:  # mmap refuses empty files; decode() reports what is wrong with it
            return memoryview(bytearray())
        mapping = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    return memoryview(mapping)


@dataclass(frozen=True)
class Layout:
    """What a file's header says, every offset checked against the data: no tensor is built (no torch)."""

    #: Name -> ``(dtype code, shape, begin, end)``, offsets relative to the data section.
    entries: dict[str, tuple[str, list[int], int, int]]
    #: The ``__metadata__`` strings.
    metadata: dict[str, str]
    #: Where the tensor data starts in the file.
    start: int

    @property
    def spec(self) -> dict[str, dict[str, Any]]:
        """``{name: {"dtype", "shape"}}`` in the form of :func:`refsight.package.tensor_spec`."""
        return {
            name: {"dtype": _CODES[code], "shape": shape} for name, (code, shape, _, _) in sorted(self.entries.items())
        }

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data (what the tensors would occupy)."""
        return sum(end - begin for _, _, begin, end in self.entries.values())


def describe(raw: memoryview) -> Layout:
    """Parse and check a whole file's header against its length, building no tensor (no torch).

    Raises :class:`SafetensorsFormatError` on any inconsistency: a header that runs past
    the end, unknown dtypes, offsets that do not match shapes, holes or overlaps.
    """
    header, start = _header(raw)
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsFormatError("__metadata__ must map strings to strings")
    data_len = len(raw) - start
    entries = {name: _entry(name, info, start, data_len) for name, info in header.items() if name != "__metadata__"}
    _check_contiguous([(begin, end) for _, _, begin, end in entries.values()], data_len)
    return Layout(entries, metadata, start)


def decode(raw: memoryview) -> tuple[dict[str, Any], dict[str, str]]:
    """Parse a writable buffer holding a whole file; returns (tensors, ``__metadata__``).

    The tensors are views into ``raw`` (no copy) and keep it alive; the checks are :func:`describe`'s.
    """
    layout = describe(raw)
    _, from_code = _dtype_tables()
    tensors = {}
    for name, (code, shape, begin, end) in layout.entries.items():
        if code not in from_code:  # a code this torch build has no dtype for
            raise SafetensorsFormatError(f"tensor {name!r}: dtype {code} is not available in this torch")
        tensors[name] = _view(raw, from_code[code], shape, layout.start + begin, end - begin)
    return tensors, layout.metadata


def _header(raw: memoryview) -> tuple[dict[str, Any], int]:
    # The JSON header and the offset where the tensor data starts.
    total = len(raw)
    if total < 8:
        raise SafetensorsFormatError("shorter than the 8-byte header length")
    n = int.from_bytes(raw[:8], "little")
    if n > _MAX_HEADER or 8 + n > total:
        raise SafetensorsFormatError(f"header length {n} does not fit in a {total}-byte file")
    try:
        header = json.loads(bytes(raw[8 : 8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SafetensorsFormatError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise SafetensorsFormatError("header is not a JSON object")
    return header, 8 + n


def _entry(name: str, info: Any, start: int, data_len: int) -> tuple[str, list[int], int, int]:
    # One tensor's (dtype code, shape, begin, end), checked against the data it must cover exactly.
    try:
        code = info["dtype"]
        itemsize = _ITEMSIZE[code]
        shape = [int(s) for s in info["shape"]]
        begin, end = (int(x) for x in info["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SafetensorsFormatError(f"tensor {name!r}: bad header entry ({exc!r})") from None
    if min(shape, default=0) < 0 or begin < 0 or end > data_len or end - begin != math.prod(shape) * itemsize:
        raise SafetensorsFormatError(f"tensor {name!r}: offsets {begin}..{end} do not match shape {shape}")
    if (start + begin) % itemsize:
        raise SafetensorsFormatError(f"tensor {name!r}: offset {begin} is not aligned to its {itemsize}-byte elements")
    return code, shape, begin, end


def _view(raw: memoryview, dtype: Any, shape: list[int], offset: int, size: int) -> Any:
    # A view of the one buffer (no copy); the tensor keeps the buffer alive.
    import torch

    count = size // dtype.itemsize
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    tensor = torch.frombuffer(raw, dtype=dtype, count=count, offset=offset)
    return tensor if len(shape) == 1 else tensor.view(shape)


def _check_contiguous(spans: list[tuple[int, int]], data_len: int) -> None:
    # The tensors tile the data exactly: no holes, no overlaps, nothing after the last one.
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            raise SafetensorsFormatError("tensor data has holes or overlaps")
        position = end
    if position != data_len:
        raise SafetensorsFormatError(f"{data_len - position} bytes after the last tensor")
