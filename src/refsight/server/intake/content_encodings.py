"""HTTP content encodings decoded as a stream, a bounded piece at a time (issue 49, item 3).

A fetched body's ``Content-Encoding`` may name several layers (``gzip, gzip``): 1,827 bytes on the
wire can be 1 GiB decoded, and a decoder that inflates a whole chunk at once (httpx's) holds all of
it before anyone counts. Here each layer is a generator that pulls from the layer below and yields
at most :data:`PIECE` bytes at a time (``decompressobj.decompress(data, max_length)``), so the
caller, counting the decoded bytes as they come, stops the work the moment its cap is passed: peak
memory is the cap plus one piece and a zlib window per layer, never the decoded size.

Decoded: ``gzip`` (``x-gzip``; concatenated members too), ``deflate`` (zlib-wrapped, or raw as some
servers send it) and ``identity``, at most :data:`MAX_LAYERS` layers. Anything else (``br``,
``zstd``, ``compress``, a name nobody knows) is refused by name, as is a third layer.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

__all__ = ["EncodingError", "MAX_LAYERS", "PIECE", "decoded", "encoding_layers"]

#: Content encodings decoded one after the other; a body that needs more is refused.
MAX_LAYERS = 2
#: The most bytes one layer hands on at a time.
PIECE = 64 * 1024
#: The names decoded, and the zlib ``wbits`` of each (None: deflate, zlib-wrapped or raw, told by its first bytes).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": None}


class EncodingError(ValueError):
    """A body whose content encoding is refused or does not decode; the message says which and why."""


def encoding_layers(values: Iterable[str]) -> list[str]:
    """The layers the ``Content-Encoding`` header values name, in the order they were applied
    (``identity`` dropped); :class:`EncodingError` for a name not decoded or more than :data:`MAX_LAYERS`."""
    layers = [name.strip().lower() for value in values for name in value.split(",")]
    layers = [name for name in layers if name and name != "identity"]
    for name in layers:
        if name not in _WBITS:
            raise EncodingError(f"Content-Encoding {name!r} is not supported (gzip, deflate or identity)")
    if len(layers) > MAX_LAYERS:
        raise EncodingError(
            f"Content-Encoding {', '.join(layers)}: {len(layers)} layers, at most {MAX_LAYERS} are decoded"
        )
    return layers


def decoded(chunks: Iterable[bytes], layers: list[str]) -> Iterator[bytes]:
    """The body ``chunks`` with ``layers`` (as :func:`encoding_layers` gives them) undone, last applied first,
    in pieces of at most :data:`PIECE` bytes once any layer is undone; nothing is decoded ahead of the reader."""
    stream: Iterable[bytes] = chunks
    for name in reversed(layers):
        stream = _inflated(stream, name)
    return iter(stream)


def _inflated(chunks: Iterable[bytes], name: str) -> Iterator[bytes]:
    """One layer undone, a piece at a time."""
    layer = _Inflater(name)
    for chunk in chunks:
        yield from layer.feed(chunk)
    layer.finish()


class _Inflater:
    """One zlib stream (or a gzip body's members, one after the other) decoded as its bytes arrive."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gzip = _WBITS[name] is not None
        self.head = b""  # deflate: its first bytes, until they tell zlib-wrapped from raw
        self.inflater = zlib.decompressobj(_WBITS[name]) if self.gzip else None

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The decoded pieces of the next ``data``, each at most :data:`PIECE` bytes."""
        if self.inflater is None:
            data = self._sniff(data)
            if data is None:
                return
        while True:
            if self.inflater.eof and not self._next_member(data):
                return
            out = self._decompress(data)
            if out:
                yield out
            if self.inflater.eof:
                data = self.inflater.unused_data
                continue
            data = self.inflater.unconsumed_tail
            # A full piece may leave output inside zlib with no input left: ask again until a short one.
            if not data and len(out) < PIECE:
                return

    def _sniff(self, data: bytes) -> bytes | None:
        """Deflate: once its first two bytes are here, the inflater for a zlib-wrapped or a raw stream and the bytes
        held so far; None while fewer have come."""
        self.head += data
        if len(self.head) < 2:
            return None
        data, self.head = self.head, b""
        # A zlib header: a 32 KiB-or-smaller deflate window, and the pair a multiple of 31 (RFC 1950).
        wrapped = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
        self.inflater = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        return data

    def _next_member(self, data: bytes) -> bool:
        """At the end of a stream: False when no bytes follow; else the next member of a multi-member gzip
        begins (True); bytes after a deflate body are an error."""
        if not data:
            return False
        if not self.gzip:
            raise EncodingError(f"bytes after the end of the {self.name} body")
        self.inflater = zlib.decompressobj(_WBITS[self.name])
        return True

    def _decompress(self, data: bytes) -> bytes:
        try:
            return self.inflater.decompress(data, PIECE)
        except zlib.error as e:
            raise EncodingError(f"the {self.name} body does not decode ({e})") from None

    def finish(self) -> None:
        """:class:`EncodingError` when the body ended before its encoding did (a cut body)."""
        if self.inflater is None or not self.inflater.eof:
            raise EncodingError(f"the {self.name} body ends before its end")
