"""A package as ONE self-checking byte string (what the Redis tier stores as a value).

Layout: ``MAGIC`` (8 bytes) + xxh3-128 of the rest (16 raw bytes) + a safetensors file
whose ``__metadata__`` holds the package header, in the store's codec's stored form: the same
bytes the disk tier writes (compressed, or the plain file: :mod:`refsight.vllm_connector.refsight_codec`; a value
written before the codec holds the plain file and reads as it did).
A value is trusted only when all of these hold: the magic, the checksum over every
following byte, a well-formed safetensors body, and a header whose image hash,
fingerprint and scope derive exactly the key it was read under (so a value stored
under the wrong key, or written by another refsight format, is refused too).
"""

from __future__ import annotations

import json

import xxhash

from ..errors import CorruptPackageError
from ..package import EncoderFingerprint, VisualPackage, canonical_json, package_key, tensor_spec
from ..vllm_connector import refsight_codec
from . import _safetensors

__all__ = ["MAGIC", "pack", "unpack", "raw_size"]

#: Names the layout; a value with another magic (an older or newer format) is a miss.
MAGIC = b"RSPKG\x001\n"
_HEADER_FIELD = "refsight.header"
_DIGEST_BYTES = 16


def pack(package: VisualPackage) -> bytes:
    """The package as one byte string (header, tensors, checksum), compressed as the disk tier stores it."""
    prepared = _safetensors.prepare(package.tensors)
    stored = _safetensors.compress_file(prepared, {_HEADER_FIELD: canonical_json(package.header())})
    body = b"".join(bytes(chunk) for chunk in stored.chunks)
    return MAGIC + xxhash.xxh3_128_digest(body) + body


def raw_size(value: bytes) -> int:
    """The bytes a :func:`pack` value's package file holds before compression (read from its header, unchecked)."""
    start = len(MAGIC) + _DIGEST_BYTES
    return refsight_codec.raw_size(value[start : start + 16], len(value) - start)


def unpack(key: str, value: bytes) -> VisualPackage:
    """The package stored as ``value`` under ``key``; raises CorruptPackageError on any mismatch."""
    start = len(MAGIC) + _DIGEST_BYTES
    if len(value) < start or value[: len(MAGIC)] != MAGIC:
        raise CorruptPackageError(key, "not a refsight package value (bad magic or truncated)")
    body = memoryview(value)[start:]
    if xxhash.xxh3_128_digest(body) != value[len(MAGIC) : start]:
        raise CorruptPackageError(key, "checksum mismatch")
    try:
        raw = refsight_codec.decompress(body)  # a new writable buffer, or ``body`` when the value was stored raw
        # A writable copy of a raw value: the tensors are views of it (torch.frombuffer wants writable memory).
        tensors, meta = _safetensors.decode(raw if raw is not body else memoryview(bytearray(body)))
        header = json.loads(meta[_HEADER_FIELD])
        fingerprint = EncoderFingerprint.from_json(header["fingerprint"])
        image_sha256 = header["image_sha256"]
        scope = header.get("scope")
    except (_safetensors.SafetensorsFormatError, KeyError, TypeError, ValueError) as exc:
        raise CorruptPackageError(key, f"unreadable value: {exc}") from None
    if package_key(image_sha256, fingerprint, scope) != key:
        raise CorruptPackageError(key, "the value holds another package (image hash, fingerprint or scope differ)")
    if tensor_spec(tensors) != header.get("spec"):
        raise CorruptPackageError(key, "tensor names, dtypes or shapes differ from the header")
    return VisualPackage(
        tensors=tensors,
        metadata=header.get("metadata", {}),
        image_sha256=image_sha256,
        fingerprint=fingerprint,
        created_at=float(header.get("created_at", 0.0)),
        encode_ms=float(header.get("encode_ms", 0.0)),
        scope=scope,
    )
