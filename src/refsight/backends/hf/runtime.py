"""Where and how a transformers model runs: device, dtype, out-of-memory, provenance.

``device`` ``auto`` picks CUDA when torch sees a GPU, else Apple's MPS, else the CPU.
``dtype`` ``auto`` is the checkpoint's own dtype (``config.dtype``) on a GPU or MPS and
float32 on the CPU: CPU kernels for half types are slow and the tiny test models are
stored in float32 anyway, while a GPU checkpoint published in bfloat16 should run in it.

Out-of-memory errors (``torch.cuda.OutOfMemoryError``, ``MemoryError`` and the CPU
allocator's "not enough memory" ``RuntimeError``) are recognised here so that the error
a user sees names the model, the dtype and the device, with what to change.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
from typing import Any, Iterator

from ...errors import BackendError, InvalidInputError, RefsightError

__all__ = [
    "resolve_device", "to_device", "resolve_dtype", "is_out_of_memory", "release_memory", "provenance", "OOM_HINT",
    "runtime_errors",
]

#: What to try when a model or a batch does not fit.
OOM_HINT = "try --dtype bfloat16, a smaller --max-pixels or --batch-size, or another --device"

# Substrings of the RuntimeError messages torch raises when an allocation fails.
_OOM_MARKERS = (
    "out of memory",
    "not enough memory",
    "can't allocate memory",
    "cannot allocate memory",
    "failed to allocate memory",
)


def resolve_device(device: str | None) -> str:
    """``auto``/None → ``cuda:N``, ``mps`` or ``cpu``; an explicit device must be usable here.

    ``cuda`` is normalised to the current GPU (``cuda:0`` ...) so provenance names one chip.
    """
    import torch

    wanted = (device or "auto").strip()
    if wanted == "auto":
        if torch.cuda.is_available():
            return f"cuda:{torch.cuda.current_device()}"
        if _mps_available():
            return "mps"
        return "cpu"
    if wanted == "cpu":
        return "cpu"
    if wanted.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InvalidInputError(
                f"device {wanted!r}", f"CUDA is not available to this torch ({torch.__version__}); use --device cpu or auto"
            )
        index = int(wanted.partition(":")[2] or torch.cuda.current_device())
        if index >= torch.cuda.device_count():
            raise InvalidInputError(f"device {wanted!r}", f"only {torch.cuda.device_count()} CUDA device(s) are visible")
        return f"cuda:{index}"
    if wanted == "mps":
        if not _mps_available():
            raise InvalidInputError("device 'mps'", "MPS is not available to this torch; use --device cpu or auto")
        return "mps"
    raise InvalidInputError(f"device {wanted!r}", "use auto, cpu, cuda, cuda:N or mps")


def _mps_available() -> bool:
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def _checkpoint_dtype(config: Any) -> Any:
    """The dtype the checkpoint was saved in, from its config (top level, then the text config)."""
    import torch

    for holder in (config, getattr(config, "text_config", None)):
        if holder is None:
            continue
        value = getattr(holder, "dtype", None) or getattr(holder, "torch_dtype", None)
        if isinstance(value, str):
            value = getattr(torch, value, None)
        if isinstance(value, torch.dtype) and value.is_floating_point:
            return value
    return None


def resolve_dtype(dtype: str | None, device: str, config: Any) -> Any:
    """``auto``/None → the checkpoint's dtype on an accelerator, float32 on the CPU; else that dtype."""
    import torch

    wanted = dtype or "auto"
    if wanted == "auto":
        if device == "cpu":
            return torch.float32
        return _checkpoint_dtype(config) or torch.float32
    value = getattr(torch, wanted, None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise InvalidInputError(f"dtype {wanted!r}", "use auto, float32, bfloat16 or float16")
    return value


def is_out_of_memory(error: BaseException) -> bool:
    """True for the ways torch and Python report a failed allocation."""
    import torch

    if isinstance(error, MemoryError):
        return True
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(error, oom):
        return True
    if isinstance(error, RuntimeError):
        text = str(error).lower()
        return any(marker in text for marker in _OOM_MARKERS)
    return False


def release_memory(device: str) -> None:
    """Return cached accelerator memory after a failed allocation, so the next request can run."""
    import gc

    import torch

    gc.collect()
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif device == "mps" and _mps_available():
        torch.mps.empty_cache()


def provenance(device: str) -> dict[str, Any]:
    """What produced a package but does not change its features (kept in metadata, not in the key)."""
    import torch
    import transformers

    from ...version import __version__ as refsight_version

    info: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "refsight": refsight_version,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def to_device(value: Any, device: str) -> Any:
    """``value`` (a tensor, or a tuple / list / dict of them) on ``device``; no copy when already there."""
    if hasattr(value, "to") and hasattr(value, "device"):
        return value if str(value.device) == device else value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        moved = {k: to_device(v, device) for k, v in value.items()}
        # transformers' ModelOutput classes are dicts with attributes: rebuild the same class.
        return moved if type(value) is dict else type(value)(**moved)
    return value


@contextlib.contextmanager
def runtime_errors(
    model: str, error: type[BackendError] = BackendError, what: str = "", *, device: str = "", dtype: str = ""
) -> Iterator[None]:
    """Turn any non-refsight exception raised inside into ``error(model, reason)``.

    The one place where torch / transformers exceptions become refsight errors;
    refsight's own errors pass through unchanged. Running out of memory says so,
    with the dtype and device and what to change, and returns the allocator's
    cache so the process can go on serving smaller requests.
    """
    try:
        yield
    except RefsightError:
        raise
    except (Exception, MemoryError) as e:  # translating is the point
        prefix = f"{what}: " if what else ""
        if is_out_of_memory(e):
            release_memory(device or "cpu")
            placement = f" (dtype {dtype or '?'} on device {device or '?'})"
            raise error(model, f"{prefix}out of memory{placement}; {OOM_HINT}. {type(e).__name__}: {e}") from e
        raise error(model, f"{prefix}{type(e).__name__}: {e}") from e
