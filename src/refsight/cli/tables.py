"""Output for people: aligned tables with headers, sizes, percentages, times and dates.

Every human format of the commands is built from these, so a figure reads the same
wherever it appears (``--json`` prints the raw values instead).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from typing import Any

from ..report import format_ms

__all__ = ["table", "iso_time", "percent", "size", "format_ms", "model_names", "model_name"]


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, right: Sequence[int] = (), indent: str = "") -> str:
    """Rows under a header line, each column as wide as its widest cell; the columns in ``right`` (figures)
    aligned right."""
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append(indent + "  ".join(padded).rstrip())
    return "\n".join(lines)


def iso_time(epoch: float | None) -> str:
    """``2026-12-01T13:50:12Z`` for a Unix time (UTC, whole seconds); ``-`` when unknown."""
    if not epoch:
        return "-"
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def percent(part: float, whole: float) -> str:
    """``46.2%`` of ``whole``; ``-`` when there is nothing to divide."""
    return f"{100 * part / whole:.1f}%" if whole else "-"


def size(n: float | None) -> str:
    """Bytes for people: ``812 B``, ``3.4 KiB``, ``52.1 MiB``, ``1.2 GiB``."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - the loop returns at GiB


def model_names(fingerprints: Iterable[dict[str, Any]]) -> dict[str, str]:
    """Fingerprint digest → the name that loads its model, from ``prune``'s listing (see :func:`model_name`)."""
    from ..backends.registry import available_models  # the registry's names: nothing is imported or loaded

    names = available_models()
    return {f["fingerprint_digest"]: model_name(f, names) for f in fingerprints}


def model_name(fingerprint: dict[str, Any], names: Sequence[str]) -> str:
    """The registered name a stored fingerprint belongs to (``refsight/tiny-qwen2-vl`` → ``tiny-qwen2-vl``),
    else ``hf:MODEL_ID``, the name that loads it."""
    model_id = str(fingerprint.get("model_id") or "")
    for name in names:
        if model_id in (name, name.split(":", 1)[-1]) or model_id.rsplit("/", 1)[-1] == name:
            return name
    if not model_id:
        return str(fingerprint.get("backend") or "?")
    return model_id if ":" in model_id or fingerprint.get("backend", "").startswith(("llama", "vllm")) else f"hf:{model_id}"
