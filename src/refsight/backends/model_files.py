"""The small files of a model source (configs, manifests, safetensors headers), read as hostile input.

A model folder or an Ollama store is input like a request body: a file may be huge, not a
regular file, nested thousands of levels deep, or hold a string where a number belongs. Every
such file refsight reads itself goes through here: read bounded and never blocking
(:func:`~refsight.inputs.reading.read_regular_file`), parsed with the depth-checked
:func:`~refsight.inputs.jsonlimits.load_json`, each field checked (:func:`integer`,
:func:`text`), so a bad file is one :class:`~refsight.errors.ModelLoadError` naming the model,
the file, the field and why, never a ``ValueError``, ``AttributeError`` or ``RecursionError``.
"""

from __future__ import annotations

import math
import os
import stat
from typing import Any

from ..errors import InvalidInputError, ModelLoadError
from ..inputs.jsonlimits import load_json
from ..inputs.reading import FileReadError, read_regular_file

__all__ = ["MAX_JSON_FILE", "MAX_SAFETENSORS_HEADER", "read_json", "parse_json", "integer", "text", "problem", "safetensors_shapes", "count"]

#: Largest JSON file of a model source read (real configs and manifests are a few KiB; a
#: config with a thousand labels is under 100 KiB).
MAX_JSON_FILE = 16 << 20
#: Largest safetensors header read (a shard of a few thousand tensors has one of a few hundred KiB).
MAX_SAFETENSORS_HEADER = 16 << 20


def problem(model: str, path: str | os.PathLike, field: str, reason: str) -> ModelLoadError:
    """The one error for a bad field of a model file: ``MODEL: FILE: FIELD: REASON`` on one line."""
    where = f"{path}: {field}" if field else str(path)
    return ModelLoadError(model, f"{where}: {reason}")


def _parse(model: str, path: str | os.PathLike, data: bytes) -> Any:
    try:
        return load_json(data, str(path))
    except InvalidInputError as e:  # too deep, not JSON, not UTF-8
        raise problem(model, path, "", e.reason) from None


def read_json(model: str, path: str | os.PathLike, *, max_bytes: int = MAX_JSON_FILE, kind: str = "a JSON object") -> Any:
    """The JSON object in the file ``path`` of ``model``'s source; ``kind`` names what it must be in the error.

    A list or scalar where an object belongs is refused here, so callers index a dict.
    """
    try:
        data = read_regular_file(path, max_bytes)
    except FileReadError as e:
        raise problem(model, path, "", e.reason) from None
    return parse_json(model, path, data, kind=kind)


def parse_json(model: str, path: str | os.PathLike, data: bytes, *, kind: str = "a JSON object") -> dict[str, Any]:
    """The JSON object in ``data``, the bytes read from ``path``: depth-checked, then parsed; anything else refused."""
    value = _parse(model, path, data)
    if not isinstance(value, dict):
        raise problem(model, path, "", f"is not {kind} (found {_kind(value)})")
    return value


def integer(
    model: str, path: str | os.PathLike, field: str, value: Any, *, low: int = 0, high: int | None = None,
) -> int:
    """``value`` of ``field`` as an int within [low, high]; a bool, float or string is refused by name."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise problem(model, path, field, f"must be an integer, got {_shown(value)}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise problem(model, path, field, f"must be {bound}, got {value}")
    return value


def text(model: str, path: str | os.PathLike, field: str, value: Any) -> str:
    """``value`` of ``field`` as a string; anything else is refused by name."""
    if not isinstance(value, str):
        raise problem(model, path, field, f"must be a string, got {_shown(value)}")
    return value


def safetensors_shapes(model: str, path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor in the safetensors file ``path``, from its header alone (no tensor data read).

    Format: 8 bytes little-endian header length, then that many bytes of JSON
    ``{name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}``.
    """
    try:
        # Non-blocking and regular files only, as read_regular_file: a FIFO named *.safetensors never hangs a load.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise problem(model, path, "", "is not a regular file")
            size = int.from_bytes(os.read(fd, 8), "little")
            if size > MAX_SAFETENSORS_HEADER:
                raise problem(model, path, "header", f"{size} bytes, over the {MAX_SAFETENSORS_HEADER}-byte limit")
            data = _read_exactly(fd, size)
        finally:
            os.close(fd)
    except OSError as e:
        raise problem(model, path, "", f"cannot read: {e.strerror or e}") from None
    if len(data) != size:
        raise problem(model, path, "header", f"the file ends inside its {size}-byte header")
    header = _parse(model, path, data)
    if not isinstance(header, dict):
        raise problem(model, path, "header", f"is not a JSON object (found {_kind(header)})")
    shapes: dict[str, tuple[int, ...]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list):
            raise problem(model, path, f"{name}.shape", f"must be a list of integers, got {_shown(shape)}")
        shapes[name] = tuple(integer(model, path, f"{name}.shape", n) for n in shape)
    return shapes


def _read_exactly(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def count(shapes: dict[str, tuple[int, ...]]) -> int:
    """The number of elements the tensors of ``shapes`` hold."""
    return sum(math.prod(shape) for shape in shapes.values())


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."
