"""Bulk ingest: encode a large reference set once, in-process or on every worker of a Ray cluster.

``refsight ingest SOURCE`` (or :func:`ingest`) reads a directory, a text file of paths or a
Parquet/CSV manifest (:mod:`~refsight.ingest.sources`), hashes every image, skips what the store
already holds *before* any encode, encodes the rest in batches (one model load per worker),
and writes packages, reference rows, retrieval vectors and ImageNet attribute records through
the driver, the one writer (:mod:`~refsight.ingest.writer`). Re-running it does only what is
missing. See :mod:`~refsight.ingest.runner` for the order of the work. The package takes its
parts (:class:`IngestParts`) and a request context, never the engine; :meth:`refsight.Engine.ingest`
builds both.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..context import RequestContext
from .runner import IngestReport, LocalExecutor, run_ingest
from .sources import IMAGE_SUFFIXES, IngestItem, list_source
from .writer import IngestParts

__all__ = ["IMAGE_SUFFIXES", "IngestItem", "IngestParts", "IngestReport", "ingest", "list_source"]


def ingest(
    parts: IngestParts,
    context: RequestContext,
    source: str | Path | Sequence[IngestItem],
    *,
    ray: str | None = None,
    actors: int = 1,
    gpus_per_actor: float = 0.0,
    cpus_per_actor: float = 1.0,
    batch_size: int = 8,
    attributes: Sequence[str] = ("imagenet",),
    errors_file: str | Path | None = None,
    progress: bool = False,
) -> IngestReport:
    """Ingest ``source`` through ``parts`` into the context's namespace, for its model;
    ``ray`` (``"local"``, ``"auto"`` or an address) runs it on Ray. :meth:`refsight.Engine.ingest` is the front door.

    Without ``ray`` every stage runs in this process, through the same code. Bad files are
    reported (``errors_file``: one JSON line each) and never stop the job.
    """
    options = {"batch_size": batch_size, "attributes": attributes, "errors_file": errors_file, "progress": progress}
    if ray is None:
        return run_ingest(parts, context, source, LocalExecutor(), **options)
    from .ray_executor import RayExecutor

    executor = RayExecutor(ray, actors=actors, gpus_per_actor=gpus_per_actor, cpus_per_actor=cpus_per_actor)
    try:
        return run_ingest(parts, context, source, executor, **options)
    finally:
        executor.close()
