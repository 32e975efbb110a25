"""Bulk ingest: encode a large reference set once, in-process or on every worker of a Ray cluster.

``refsight ingest SOURCE`` (or :func:`ingest`) reads a directory, a text file of paths or a
Parquet/CSV manifest (:mod:`~refsight.ingest.sources`), hashes every image, skips what the store
already holds *before* any encode, encodes the rest in batches (one model load per worker),
and writes packages, reference rows, retrieval vectors and ImageNet attribute records through
the driver, the one writer (:mod:`~refsight.ingest.writer`). Re-running it does only what is
missing. See :mod:`~refsight.ingest.runner` for the order of the work.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .runner import IngestReport, LocalExecutor, run_ingest
from .sources import IMAGE_SUFFIXES, IngestItem, list_source

if TYPE_CHECKING:  # pragma: no cover
    from ..engine import Engine

__all__ = ["IMAGE_SUFFIXES", "IngestItem", "IngestReport", "ingest", "list_source"]


def ingest(
    engine: Engine,
    source: str | Path | Sequence[IngestItem],
    *,
    ray: str | None = None,
    actors: int = 1,
    gpus_per_actor: float = 0.0,
    cpus_per_actor: float = 1.0,
    batch_size: int = 8,
    model: str | None = None,
    namespace: str | None = None,
    attributes: Sequence[str] = ("imagenet",),
    errors_file: str | Path | None = None,
    progress: bool = False,
) -> IngestReport:
    """Ingest ``source`` into ``engine``'s store; ``ray`` (``"local"``, ``"auto"`` or an address) runs it on Ray.

    Without ``ray`` every stage runs in this process, through the same code. Bad files are
    reported (``errors_file``: one JSON line each) and never stop the job.
    """
    if ray is None:
        executor = LocalExecutor()
        return run_ingest(
            engine, source, executor, model=model, namespace=namespace, batch_size=batch_size,
            attributes=attributes, errors_file=errors_file, progress=progress,
        )
    from .ray_executor import RayExecutor

    executor = RayExecutor(ray, actors=actors, gpus_per_actor=gpus_per_actor, cpus_per_actor=cpus_per_actor)
    try:
        return run_ingest(
            engine, source, executor, model=model, namespace=namespace, batch_size=batch_size,
            attributes=attributes, errors_file=errors_file, progress=progress,
        )
    finally:
        executor.close()
