"""refsight's lossless codec: the bytes every tier keeps of a package, a prefix state or a vLLM encoder output.

It lives beside the vLLM connector (xxhash, zstandard and numpy; nothing of refsight) because the
connector stores vLLM's encoder outputs with it, inside vLLM's own environment where only this
folder is importable: the same codec in every tier. refsight's store imports it as
``refsight.vllm_connector.refsight_codec`` (its safetensors files: :func:`refsight.store._safetensors.compress_file`),
the connector's :mod:`refsight_ec_store` as the top-level ``refsight_codec``.

A safetensors file is cut into frames: its header, then each tensor's bytes. A tensor of ``k``-byte
elements may be split into ``k`` byte planes (byte ``j`` of every element together, as blosc's shuffle
and ZipNN do): the planes that hold a float's sign and exponent repeat a few values and compress, the
low mantissa planes are noise and do not, and keeping them apart lets zstd store those as they are.
Each frame is compressed with zstd at :data:`LEVEL`, over its byte planes and over its plain bytes,
and the smaller is kept (planes win on dense floats, plain bytes on runs of zero elements, as in
post-ReLU features); a frame that does not shrink by :data:`MIN_RATIO` is kept raw, and so is a whole
entry: a file whose container would save too little is written as the plain safetensors file (a
"raw" entry is one without the magic). ``benchmarks/codec.py`` measured these choices on every kind
the store holds (``docs/architecture/replicas.md``).

Stored form of a compressed entry::

    MAGIC (8) | raw size (8, LE) | xxh3-128 of every following byte (16) | table length (4, LE)
    | table (JSON: {"raw_xxh3": hex, "frames": [[method, plane, raw length, stored length], ...]})
    | the frames back to back

The magic read as a little-endian length is far above any safetensors header, so an entry
written before this codec (a plain safetensors file) can never be taken for one; such an entry
reads as it always did (:func:`decompress` hands it back untouched).

Decoding trusts nothing: the stored checksum is checked before any table is read, the table
must account for every stored byte and its raw lengths for the raw size, no frame may claim
more than :data:`MAX_RATIO` times its stored bytes (so no input, damaged or hostile, can cost
more memory or work than its size justifies: a decompression bomb is refused before any
allocation), each frame must decompress to exactly its raw length, and the whole result must
match the raw checksum: decoded == what was written, bit for bit, or :class:`CodecError`.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Iterable

import xxhash

__all__ = [
    "MAGIC", "LEVEL", "MIN_RATIO", "MAX_RATIO", "CodecError", "Compressed", "compress", "decompress", "frames",
    "raw_size", "shuffle", "unshuffle_into",
]

#: Opens a compressed entry; as a little-endian u64 it is ~5e17, far above safetensors' 100 MB header limit.
MAGIC = b"RSZ\x01\x00\x01\x0d\x0a"
#: zstd's level (``benchmarks/codec.py``: level 1 decodes as fast as any, and levels 3 and 9 buy under 1% of ratio
#: for 1.5-6x the encode time).
LEVEL = 1
#: A frame (or a whole entry) that does not shrink by at least this much is kept raw: decoding costs ~0.5 ms per MB,
#: so at the fleet's 137 MB/s object-store read bar a ratio under ~1.07-1.1 would read slower than the raw bytes
#: (``benchmarks/codec.py``: dense real f32 and f16 activations land at 1.08 and are kept raw).
MIN_RATIO = 1.1
#: The most raw bytes a stored byte may stand for: the bound on what decoding any input may cost.
MAX_RATIO = 256
_PREFIX = len(MAGIC) + 8 + 16 + 4
_MAX_TABLE = 16 * 1024 * 1024
_WORDS = {2: "uint16", 4: "uint32", 8: "uint64"}
_RAW, _ZSTD = "raw", "zstd"


class CodecError(ValueError):
    """The bytes are not a well-formed compressed entry (the caller reports it as corrupt: a miss, refilled)."""


@dataclass(frozen=True)
class Compressed:
    """What :func:`compress` gives: the chunks to write, and the sizes before and after."""

    #: The stored form, as chunks to write one after the other (no joined copy).
    chunks: list[Any]
    raw_bytes: int
    stored_bytes: int


_contexts = threading.local()


def _zstd() -> tuple[Any, Any]:
    # zstd contexts are not thread-safe: one pair per thread, reused (creating one costs more than a small frame).
    pair = getattr(_contexts, "pair", None)
    if pair is None:
        import zstandard

        pair = _contexts.pair = (
            zstandard.ZstdCompressor(level=LEVEL, write_content_size=True, write_checksum=False),
            zstandard.ZstdDecompressor(),
        )
    return pair


def shuffle(data: Any, plane: int) -> Any:
    """``data`` (``plane``-byte elements) as ``plane`` byte planes back to back (a uint8 numpy array)."""
    import numpy as np

    words = np.frombuffer(data, dtype=_WORDS[plane])
    planes = np.empty((plane, words.size), dtype=np.uint8)
    for j in range(plane):
        planes[j] = words >> (8 * j) if j else words  # setitem keeps the low byte
    return planes.reshape(-1)


def unshuffle_into(planes: Any, dest: Any, plane: int) -> None:
    """Write the elements whose byte planes are ``planes`` into the writable buffer ``dest``."""
    import numpy as np

    words = np.frombuffer(dest, dtype=_WORDS[plane])
    source = np.frombuffer(planes, dtype=np.uint8).reshape(plane, words.size)
    words[:] = source[plane - 1]
    for j in range(plane - 2, -1, -1):
        words <<= 8
        words |= source[j]


def compress(frames: Iterable[tuple[Any, int]]) -> Compressed:
    """``frames`` (bytes-like, element size) as the stored form: a container, or the raw chunks when too little is saved.

    The raw form is the frames' bytes concatenated: what was written before this codec.
    """
    compressor, _ = _zstd()
    frames = [(memoryview(data).cast("B"), plane) for data, plane in frames]
    raw_bytes = sum(len(view) for view, _ in frames)
    table, chunks = [], []
    for view, plane in frames:
        method, plane, stored = _compress_frame(compressor, view, plane)
        table.append([method, plane, len(view), len(stored)])
        chunks.append(stored)
    hasher = xxhash.xxh3_128()
    for view, _ in frames:
        hasher.update(view)
    head = json.dumps({"raw_xxh3": hasher.hexdigest(), "frames": table}, separators=(",", ":")).encode()
    stored_bytes = _PREFIX + len(head) + sum(len(chunk) for chunk in chunks)
    if raw_bytes < MIN_RATIO * stored_bytes:  # the container's own bytes count too
        return Compressed([view for view, _ in frames], raw_bytes, raw_bytes)
    body = [len(head).to_bytes(4, "little"), head, *chunks]
    digest = xxhash.xxh3_128()
    for chunk in body:
        digest.update(chunk)
    return Compressed([MAGIC + raw_bytes.to_bytes(8, "little") + digest.digest(), *body], raw_bytes, stored_bytes)


def _compress_frame(compressor: Any, view: memoryview, plane: int) -> tuple[str, int, Any]:
    # (method, plane, stored bytes) of one frame: zstd over its byte planes or over its plain bytes, whichever is
    # smaller (planes win on dense floats, plain bytes on runs of zero elements: post-ReLU features), or the raw
    # bytes when that saves too little.
    if not view:
        return _RAW, 1, view
    tries = [(1, compressor.compress(view))]
    if plane in _WORDS and len(view) % plane == 0:
        tries.append((plane, compressor.compress(shuffle(view, plane))))
    plane, packed = min(tries, key=lambda item: len(item[1]))
    if len(view) < MIN_RATIO * len(packed) or len(view) > MAX_RATIO * len(packed):
        return _RAW, 1, view  # too little saved, or more than a reader may accept: kept as it is
    return _ZSTD, plane, packed


def raw_size(head: bytes | memoryview, size: int) -> int:
    """The raw size of an entry of ``size`` stored bytes whose first 16 bytes are ``head`` (no check)."""
    if len(head) >= 16 and bytes(head[: len(MAGIC)]) == MAGIC:
        return int.from_bytes(head[8:16], "little")
    return size


def frames(stored: memoryview) -> list[tuple[str, int, int, int]]:
    """The checked frame table of an entry: ``(method, plane, raw length, stored length)`` each; ``[]`` for a raw entry."""
    if len(stored) < len(MAGIC) or bytes(stored[: len(MAGIC)]) != MAGIC:
        return []
    return _read_table(stored)[1]["frames"]


def decompress(stored: memoryview, *, expected: int | None = None) -> memoryview:
    """The raw bytes of an entry: ``stored`` itself when it is not a container, else a new writable buffer.

    ``expected``: the raw size the caller knows (an index row's); another size is refused before any
    allocation. Raises :class:`CodecError` for any container that fails a check (see the module's docstring).
    """
    if len(stored) < len(MAGIC) or bytes(stored[: len(MAGIC)]) != MAGIC:
        if expected is not None and len(stored) != expected:
            raise CodecError(f"a raw entry of {len(stored)} bytes, where {expected} were recorded")
        return stored
    raw_bytes, table, frames_at = _read_table(stored)
    if expected is not None and raw_bytes != expected:
        raise CodecError(f"the entry holds {raw_bytes} raw bytes, where {expected} were recorded")
    raw = bytearray(raw_bytes)
    _, decompressor = _zstd()
    out, at = memoryview(raw), frames_at
    for method, plane, raw_len, stored_len in table["frames"]:
        _decode_frame(decompressor, method, plane, stored[at : at + stored_len], out[:raw_len])
        out, at = out[raw_len:], at + stored_len
    if xxhash.xxh3_128_hexdigest(raw) != table["raw_xxh3"]:
        raise CodecError("the decoded bytes do not match the entry's raw checksum")
    return memoryview(raw)


def _read_table(stored: memoryview) -> tuple[int, dict[str, Any], int]:
    # The raw size, the table and where the frames start, once the stored checksum and every length agree.
    if len(stored) < _PREFIX:
        raise CodecError("a compressed entry shorter than its fixed header")
    if xxhash.xxh3_128_digest(stored[len(MAGIC) + 24 :]) != bytes(stored[len(MAGIC) + 8 : len(MAGIC) + 24]):
        raise CodecError("checksum mismatch in a compressed entry")
    raw_bytes = int.from_bytes(stored[len(MAGIC) : len(MAGIC) + 8], "little")
    length = int.from_bytes(stored[_PREFIX - 4 : _PREFIX], "little")
    if length > min(_MAX_TABLE, len(stored) - _PREFIX):
        raise CodecError(f"a table of {length} bytes does not fit the entry")
    table = _parsed_table(bytes(stored[_PREFIX : _PREFIX + length]))
    frames_at = _PREFIX + length
    _check_frames(table["frames"], raw_bytes, len(stored) - frames_at)
    return raw_bytes, table, frames_at


def _parsed_table(text: bytes) -> dict[str, Any]:
    # The table's JSON with its frames as (method, plane, raw length, stored length) tuples and a checksum given.
    try:
        table = json.loads(text)
        frames = [(str(m), int(p), int(r), int(s)) for m, p, r, s in table["frames"]]
        str(table["raw_xxh3"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CodecError(f"unreadable table in a compressed entry: {exc!r}") from None
    table["frames"] = frames
    return table


def _check_frames(frames: list[tuple[str, int, int, int]], raw_bytes: int, stored_bytes: int) -> None:
    # The frames add up to the entry's sizes, and each is of a kind this codec writes, with lengths that fit it: a
    # forged table can neither overrun the entry nor ask for more memory than its ratio bound allows.
    if sum(s for *_, s in frames) != stored_bytes or sum(r for _, _, r, _ in frames) != raw_bytes:
        raise CodecError("the table's frame lengths do not add up to the entry's sizes")
    for method, plane, raw_len, stored_len in frames:
        if min(raw_len, stored_len) < 0 or raw_len > MAX_RATIO * stored_len or (method, plane) not in _FRAME_KINDS:
            raise CodecError(f"a frame ({method}, plane {plane}, {stored_len} -> {raw_len} bytes) is not one this codec writes")
        if method == _RAW and raw_len != stored_len or raw_len % plane:
            raise CodecError("a frame's lengths do not fit its method")


_FRAME_KINDS = {(_RAW, 1), (_ZSTD, 1), *((_ZSTD, plane) for plane in _WORDS)}


def _decode_frame(decompressor: Any, method: str, plane: int, data: memoryview, dest: memoryview) -> None:
    # One frame into ``dest`` (exactly its raw length: the table was checked against every size).
    if method == _RAW:
        dest[:] = data
        return
    import zstandard

    try:
        if zstandard.frame_content_size(data) != len(dest):
            raise CodecError("a zstd frame declares another size than the table's")
        out = decompressor.decompress(data, max_output_size=len(dest))
    except zstandard.ZstdError as exc:
        raise CodecError(f"a zstd frame does not decode: {exc}") from None
    if len(out) != len(dest):
        raise CodecError("a zstd frame decoded to another size than the table's")
    if plane > 1:
        unshuffle_into(out, dest, plane)
    else:
        dest[:] = out
