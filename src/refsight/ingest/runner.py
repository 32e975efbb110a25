"""One ingest, start to end: list, hash, probe, encode, write, index, report.

The order is what makes it resumable and cheap to re-run:

1. **hash** every file on the workers (decode under the intake limits; bad files become error rows);
2. **probe** the store on the driver with those hashes, before any encode: what each image still
   lacks (package, vector, ImageNet record, reference row) — a re-run of a finished ingest stops
   here, having loaded no VLM and encoded nothing;
3. **encode** on the workers only what is missing (one model load per worker), and **write** each
   row on the driver as it arrives (:class:`~refsight.ingest.writer.IngestWriter`, the one writer);
4. **index**: the retrieval index catches up from the cached vectors (no image decoded), so the
   first search or compare after the ingest does no reference work.

The in-process executor and the Ray one (:mod:`refsight.ingest.ray_executor`) run the same stage
code (:mod:`refsight.ingest.stages`); only where batches run differs.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from ..context import RequestContext
from ..errors import InvalidInputError, RefsightError, StoreUnavailableError
from ..inputs.images import IntakeLimits
from ..package import EncoderFingerprint
from ..inputs.text import printable_text
from ..support.timing import progress_bar
from .sources import IngestItem, list_source
from .stages import EncodeStage, StageSpec, columns, hash_stage, rows
from .writer import IngestParts, IngestWriter, Todo

__all__ = ["Executor", "IngestReport", "LocalExecutor", "run_ingest"]

#: Files hashed per batch (a hash-stage task on Ray).
HASH_BATCH = 64


@dataclass
class IngestReport:
    """What an ingest did: ``added`` images were encoded now, ``cached`` needed no encode, ``failed`` were refused."""

    images: int
    added: int
    cached: int
    failed: int
    encode_s: float
    wall_s: float
    images_per_s: float
    actors: int
    mode: str
    vectors: int  # retrieval vectors computed now
    records: int  # ImageNet attribute records computed now
    hash_s: float  # the hash-and-probe pass (wall)
    write_s: float  # the driver's time writing rows (the one writer's share of the wall)
    errors_file: str | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view (the final JSON report)."""
        return asdict(self)


class Executor(Protocol):
    """Where stage batches run: in this process, or on a Ray cluster."""

    mode: str
    actors: int

    def fingerprint(self, spec: StageSpec) -> EncoderFingerprint:
        """The encoder fingerprint a worker's backend has (loads the model once, somewhere)."""

    def hash(self, items: list[dict[str, Any]], limits: IntakeLimits) -> Iterator[dict[str, Any]]:
        """Run :func:`hash_stage` over ``{index, path}`` rows; yields column batches as they finish."""

    def encode(self, items: list[dict[str, Any]], spec: StageSpec, batch_size: int) -> Iterator[dict[str, Any]]:
        """Run :class:`EncodeStage` over the probe's rows; yields column batches as they finish."""


class LocalExecutor:
    """Every stage in this process, one batch after another (``refsight ingest`` without ``--ray``)."""

    mode = "in-process"
    actors = 0

    def __init__(self) -> None:
        self._stage: EncodeStage | None = None

    def _stage_for(self, spec: StageSpec) -> EncodeStage:
        if self._stage is None or self._stage.spec != spec:
            self._stage = EncodeStage(spec)
        return self._stage

    def fingerprint(self, spec: StageSpec) -> EncoderFingerprint:
        """The backend's fingerprint (the model loads here, once; the encode stage reuses it)."""
        return self._stage_for(spec).fingerprint()

    def hash(self, items: list[dict[str, Any]], limits: IntakeLimits) -> Iterator[dict[str, Any]]:
        """:func:`hash_stage` batch by batch."""
        for start in range(0, len(items), HASH_BATCH):
            yield hash_stage(columns(items[start : start + HASH_BATCH], ("index", "path")), limits=limits)

    def encode(self, items: list[dict[str, Any]], spec: StageSpec, batch_size: int) -> Iterator[dict[str, Any]]:
        """:class:`EncodeStage` batch by batch."""
        stage = self._stage_for(spec)
        names = ("index", "path", "sha256", "need_package", "need_vector", "need_record")
        for start in range(0, len(items), batch_size):
            yield stage(columns(items[start : start + batch_size], names))

    @property
    def encodes(self) -> int:
        """Packages encoded by this executor's stage."""
        return self._stage.encodes if self._stage is not None else 0


def run_ingest(
    parts: IngestParts,
    context: RequestContext,
    source: str | Path | Sequence[IngestItem],
    executor: Executor,
    *,
    batch_size: int = 8,
    attributes: Sequence[str] = ("imagenet",),
    errors_file: str | Path | None = None,
    progress: bool = False,
) -> IngestReport:
    """Ingest ``source`` (a directory, path list, manifest, or items) into the context's namespace; see the module docstring."""
    start = time.perf_counter()
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidInputError("batch_size", f"must be a positive integer, not {batch_size!r}")
    unknown = sorted(set(attributes) - {"imagenet"})
    if unknown:
        raise InvalidInputError("attributes", f"ingest computes the imagenet record only, not {unknown}")
    embedder = parts.retrieval.registry_name
    if embedder is None:
        raise InvalidInputError("embedder", "ingest loads the embedder on its workers by registry name; give a name")
    items = list(source) if not isinstance(source, (str, Path)) else list_source(source)
    spec = StageSpec(
        model=context.model, backend_options=context.options.as_kwargs(), scope=context.scope, limits=parts.limits,
        embedder=embedder, attributes=tuple(attributes),
    )
    job = _Ingest(parts, context, executor, spec, items, progress)
    job.hash_and_probe()
    hash_s = time.perf_counter() - start
    job.encode_and_write(batch_size)
    job.write_repeated_images()
    if job.writer is not None:
        parts.retrieval.sync(context.namespace, scope=context.scope)  # from the cached vectors: the first search finds it done
    wall = time.perf_counter() - start
    return IngestReport(
        images=len(items), added=job.added, cached=len(items) - job.added - len(job.errors), failed=len(job.errors),
        encode_s=round(job.encode_ms / 1000, 3), wall_s=round(wall, 3),
        images_per_s=round(len(items) / wall, 3) if wall > 0 else 0.0, actors=executor.actors, mode=executor.mode,
        vectors=job.vectors, records=job.records, hash_s=round(hash_s, 3), write_s=round(job.write_s, 3),
        errors_file=_write_errors(errors_file, items, job.errors),
    )


#: Hashed images probed per store round trip.
PROBE_BATCH = 256


class _Ingest:
    """One ingest under way: the passes of :func:`run_ingest` and what they counted."""

    def __init__(
        self, parts: IngestParts, context: RequestContext, executor: Executor, spec: StageSpec, items: list[IngestItem],
        progress: bool,
    ) -> None:
        self.parts, self.context, self.executor, self.spec, self.items = parts, context, executor, spec, items
        self.progress = progress
        self.errors: dict[int, str] = {}
        self.todos: list[Todo] = []
        self.writer: IngestWriter | None = None
        self.added = self.vectors = self.records = 0
        self.encode_ms = self.write_s = 0.0

    def hash_and_probe(self) -> None:
        """Hash every file on the workers, then probe the store for what each good image lacks."""
        pending: list[tuple[int, IngestItem, str]] = []
        with progress_bar(len(self.items), "hashing", enabled=self.progress) as bar:
            rows_in = [{"index": i, "path": item.path} for i, item in enumerate(self.items)]
            for batch in self.executor.hash(rows_in, self.parts.limits):
                for row in rows(batch):
                    if row["error"]:
                        self.errors[row["index"]] = row["error"]
                    else:
                        pending.append((row["index"], self.items[row["index"]], row["sha256"]))
                if len(pending) >= PROBE_BATCH:
                    self._probe(pending)
                bar.update(len(batch["index"]))
            self._probe(pending)

    def _probe(self, pending: list[tuple[int, IngestItem, str]]) -> None:
        if not pending:
            return
        if self.writer is None:
            # Planned at the first good image: a source of only bad files loads no model.
            fingerprint = self.executor.fingerprint(self.spec)
            self.spec = dataclasses.replace(self.spec, fingerprint=fingerprint)
            self.writer = IngestWriter(self.parts, self.context, fingerprint=fingerprint, attributes=self.spec.attributes)
        found, refused = self.writer.probe(list(pending))
        self.todos.extend(found)
        self.errors.update(refused)
        pending.clear()

    def encode_and_write(self, batch_size: int) -> None:
        """Encode on the workers only what is missing; write each row on the driver as it arrives."""
        work = [t for t in self.todos if t.needs_worker and not self.writer.is_pending_elsewhere(t)]
        if not work:
            return
        by_index = {t.index: t for t in work}
        with progress_bar(len(work), "encoding", enabled=self.progress) as bar:
            for batch in self.executor.encode([t.row() for t in work], self.spec, batch_size):
                for row in rows(batch):
                    todo = by_index[row["index"]]
                    if row["error"]:
                        self.errors[todo.index] = row["error"]
                    else:
                        self._write(todo, row)
                    bar.update(1)

    def _write(self, todo: Todo, row: dict[str, Any]) -> None:
        clock = time.perf_counter()
        try:
            if self.writer.write(todo, row):
                self.added += 1
                self.encode_ms += row["encode_ms"]
            self.vectors += bool(row["vector"])
            self.records += bool(row["record"])
        except StoreUnavailableError:
            raise  # the store, not this image (a full disk, an unreachable catalog): stop; re-run resumes
        except RefsightError as e:
            self.errors[todo.index] = str(e)
        self.write_s += time.perf_counter() - clock

    def write_repeated_images(self) -> None:
        """The reference rows of images another row of this run computed (the same picture at two paths)."""
        later = [t for t in self.todos if t.need_reference and self.writer.is_pending_elsewhere(t)]
        for todo in later:
            try:
                self.writer.write_from_kept(todo)
            except StoreUnavailableError:
                raise
            except RefsightError as e:
                self.errors[todo.index] = f"{todo.item.path}: {e}"


def _write_errors(path: str | Path | None, items: list[IngestItem], errors: dict[int, str]) -> str | None:
    """One JSON line ``{"input", "error"}`` per refused image, in source order."""
    if path is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for index in sorted(errors):
            # A path may hold undecodable bytes (it was read all the same): the file must stay UTF-8.
            line = {"input": printable_text(items[index].path), "error": printable_text(errors[index])}
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    return str(path)
