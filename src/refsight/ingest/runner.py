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

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import InvalidInputError, RefsightError, StoreUnavailableError
from ..images import IntakeLimits
from ..package import EncoderFingerprint
from ..timing import progress_bar
from .sources import IngestItem, list_source
from .stages import EncodeStage, StageSpec, columns, hash_stage, rows
from .writer import IngestWriter, Todo

if TYPE_CHECKING:  # pragma: no cover
    from ..engine import Engine

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
    engine: Engine,
    source: str | Path | Sequence[IngestItem],
    executor: Executor,
    *,
    model: str | None = None,
    namespace: str | None = None,
    batch_size: int = 8,
    attributes: Sequence[str] = ("imagenet",),
    errors_file: str | Path | None = None,
    progress: bool = False,
) -> IngestReport:
    """Ingest ``source`` (a directory, path list, manifest, or items) into ``engine``'s store; see the module docstring."""
    start = time.perf_counter()
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidInputError("batch_size", f"must be a positive integer, not {batch_size!r}")
    unknown = sorted(set(attributes) - {"imagenet"})
    if unknown:
        raise InvalidInputError("attributes", f"ingest computes the imagenet record only, not {unknown}")
    items = list(source) if not isinstance(source, (str, Path)) else list_source(source)
    context = engine.context(namespace, model)
    namespace = context.namespace
    embedder = engine.retrieval.registry_name
    if embedder is None:
        raise InvalidInputError("embedder", "ingest loads the embedder on its workers by registry name; give a name")
    spec = StageSpec(
        model=context.model, backend_options=context.options.as_kwargs(), scope=context.scope, limits=engine.limits,
        embedder=embedder, attributes=tuple(attributes),
    )
    errors: dict[int, str] = {}
    todos: list[Todo] = []
    writer: IngestWriter | None = None
    pending_probe: list[tuple[int, IngestItem, str]] = []

    def probe(flush: bool) -> None:
        if pending_probe and (flush or len(pending_probe) >= 256):
            found, refused = writer.probe(list(pending_probe))
            todos.extend(found)
            errors.update(refused)
            pending_probe.clear()

    with progress_bar(len(items), "hashing", enabled=progress) as bar:
        fingerprint = None
        for batch in executor.hash([{"index": i, "path": it.path} for i, it in enumerate(items)], engine.limits):
            for row in rows(batch):
                if row["error"]:
                    errors[row["index"]] = row["error"]
                    continue
                if writer is None:
                    # Planned at the first good image: a source of only bad files loads no model.
                    fingerprint = executor.fingerprint(spec)
                    spec = StageSpec(**{**spec.__dict__, "fingerprint": fingerprint})
                    writer = IngestWriter(engine, context, fingerprint=fingerprint, attributes=spec.attributes)
                pending_probe.append((row["index"], items[row["index"]], row["sha256"]))
            probe(flush=False)
            bar.update(len(batch["index"]))
        probe(flush=True)

    hash_s = time.perf_counter() - start
    added = vectors = records = 0
    encode_ms = write_s = 0.0
    work = [t for t in todos if t.needs_worker and not (writer and writer.is_pending_elsewhere(t))]
    later = [t for t in todos if t.need_reference and writer and writer.is_pending_elsewhere(t)]
    by_index = {t.index: t for t in work}
    if work:
        with progress_bar(len(work), "encoding", enabled=progress) as bar:
            for batch in executor.encode([t.row() for t in work], spec, batch_size):
                for row in rows(batch):
                    todo = by_index[row["index"]]
                    if row["error"]:
                        errors[todo.index] = row["error"]
                    else:
                        clock = time.perf_counter()
                        try:
                            if writer.write(todo, row):
                                added += 1
                                encode_ms += row["encode_ms"]
                            vectors += bool(row["vector"])
                            records += bool(row["record"])
                        except StoreUnavailableError:
                            raise  # the store, not this image (a full disk, an unreachable catalog): stop; re-run resumes
                        except RefsightError as e:
                            errors[todo.index] = str(e)
                        write_s += time.perf_counter() - clock
                    bar.update(1)
    for todo in later:
        try:
            writer.write_from_kept(todo)
        except StoreUnavailableError:
            raise
        except RefsightError as e:
            errors[todo.index] = f"{todo.item.path}: {e}"
    if writer is not None:
        engine.index(namespace=namespace)  # from the cached vectors: the first search finds it done
    engine.store.counters.flush()  # the misses of this ingest are on disk for `stats` at once
    wall = time.perf_counter() - start
    path = _write_errors(errors_file, items, errors)
    return IngestReport(
        images=len(items), added=added, cached=len(items) - added - len(errors), failed=len(errors),
        encode_s=round(encode_ms / 1000, 3), wall_s=round(wall, 3),
        images_per_s=round(len(items) / wall, 3) if wall > 0 else 0.0, actors=executor.actors, mode=executor.mode,
        vectors=vectors, records=records, hash_s=round(hash_s, 3), write_s=round(write_s, 3), errors_file=path,
    )


def _write_errors(path: str | Path | None, items: list[IngestItem], errors: dict[int, str]) -> str | None:
    """One JSON line ``{"input", "error"}`` per refused image, in source order."""
    if path is None:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for index in sorted(errors):
            f.write(json.dumps({"input": items[index].path, "error": errors[index]}, ensure_ascii=False) + "\n")
    return str(path)
