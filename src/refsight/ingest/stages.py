"""The work of an ingest, as plain functions and classes: the same code runs in-process and on Ray.

Two stages run on workers and touch no store (the driver is the one writer, see
:mod:`refsight.ingest.writer`):

- :func:`hash_stage` reads and decodes each file under the intake limits and returns its pixel
  hash, or an error row (a bad file never stops the job);
- :class:`EncodeStage` (one per Ray actor, models loaded once per actor, and only when a batch
  needs them) decodes the files that need work and computes what each lacks: the visual package
  (through :func:`refsight.cache.packages.encode_packages`, the one encode call), the retrieval vector
  of the default embedder and the ImageNet attribute record.

Batches are column dicts (what Ray Data's ``map_batches`` passes with ``batch_format="numpy"``);
:func:`rows` and :func:`columns` convert. Packages travel to the driver pickled (tensors and all).
"""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..inputs.images import ImageInput, IntakeLimits, load_image
from ..package import EncoderFingerprint

__all__ = ["HASH_COLUMNS", "ENCODE_COLUMNS", "EncodeStage", "StageSpec", "columns", "hash_stage", "rows"]

#: Columns :func:`hash_stage` returns.
HASH_COLUMNS = ("index", "sha256", "error")
#: Columns :class:`EncodeStage` returns.
ENCODE_COLUMNS = ("index", "sha256", "data", "fmt", "package", "vector", "record", "encode_ms", "error")


@dataclass(frozen=True)
class StageSpec:
    """Everything a worker needs to build its stage (picklable; no store, no open file)."""

    model: str
    backend_options: dict[str, Any] = field(default_factory=dict)
    scope: str | None = None
    limits: IntakeLimits = IntakeLimits()
    embedder: str = "conse"
    attributes: tuple[str, ...] = ("imagenet",)
    #: the driver's plan: a worker whose backend has another fingerprint refuses to encode
    fingerprint: EncoderFingerprint | None = None


def rows(batch: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """A column batch as a list of row dicts with plain Python values."""
    names = list(batch)
    count = len(batch[names[0]]) if names else 0
    return [{name: _plain(batch[name][i]) for name in names} for i in range(count)]


def columns(items: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Row dicts as a column batch (object arrays: strings and bytes keep their exact values)."""
    out: dict[str, np.ndarray] = {}
    for name in names:
        column = np.empty(len(items), dtype=object)
        for i, item in enumerate(items):
            column[i] = item[name]
        out[name] = column
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) and value.dtype == np.uint8:
        return value.tobytes()  # Arrow binary columns may come back as uint8 arrays
    return value


def _error(exc: BaseException) -> str:
    # Library errors already name the input and the reason; anything else keeps its type.
    from ..errors import RefsightError

    return str(exc) if isinstance(exc, RefsightError) else f"{type(exc).__name__}: {exc}"


def hash_stage(batch: Mapping[str, Sequence[Any]], *, limits: IntakeLimits) -> dict[str, np.ndarray]:
    """``{index, path}`` rows → ``{index, sha256, error}``: decode and hash, or say why not."""
    out = []
    for row in rows(batch):
        try:
            image = load_image(Path(row["path"]), limits=limits, name=row["path"])
            out.append({"index": row["index"], "sha256": image.sha256, "error": ""})
        except Exception as e:  # a bad file is an error row, never the end of the job
            out.append({"index": row["index"], "sha256": "", "error": _error(e)})
    return columns(out, HASH_COLUMNS)


class EncodeStage:
    """Encode, embed and classify the images of a batch that need it (one instance per actor).

    Input rows: ``index, path, sha256`` (the hash pass's) and ``need_package, need_vector,
    need_record`` (the driver's probe of the store). Models load on first need, so a batch that
    only needs its reference row written loads nothing. ``encodes`` counts packages encoded.
    """

    def __init__(self, spec: StageSpec) -> None:
        self.spec = spec
        self.encodes = 0
        self._backend = None
        self._embedder = None
        self._imagenet = None

    # -- the models, each loaded once ------------------------------------------------------
    def backend(self) -> Any:
        """The VLM backend (its fingerprint checked against the driver's plan)."""
        if self._backend is None:
            from ..backends.registry import get_backend

            backend = get_backend(self.spec.model, **self.spec.backend_options)
            if self.spec.fingerprint is not None and backend.fingerprint() != self.spec.fingerprint:
                # Another dtype or kernel on this worker would give packages under other keys.
                raise RuntimeError(
                    f"this worker's {self.spec.model} has fingerprint {backend.fingerprint().digest[:12]}, "
                    f"the plan {self.spec.fingerprint.digest[:12]}: give every worker the same device and settings"
                )
            self._backend = backend
        return self._backend

    def fingerprint(self) -> EncoderFingerprint:
        """The backend's encoder fingerprint (loads the model)."""
        return self.backend().fingerprint()

    def embedder(self) -> Any:
        """The retrieval embedder named in the spec."""
        if self._embedder is None:
            from ..embedders.registry import get_embedder

            self._embedder = get_embedder(self.spec.embedder)
        return self._embedder

    def imagenet(self) -> Any:
        """The ImageNet attribute source."""
        if self._imagenet is None:
            from ..embedders.imagenet_source import ImageNetAttributeSource

            self._imagenet = ImageNetAttributeSource()
        return self._imagenet

    # -- one batch ---------------------------------------------------------------------------
    def __call__(self, batch: Mapping[str, Sequence[Any]]) -> dict[str, np.ndarray]:
        """Compute what each row needs; a row that fails is an error row, the others go on."""
        items = rows(batch)
        out: dict[int, dict[str, Any]] = {}
        images: dict[int, ImageInput] = {}
        for row in items:
            out[row["index"]] = result = {
                "index": row["index"], "sha256": row["sha256"], "data": b"", "fmt": "", "package": b"", "vector": b"",
                "record": "", "encode_ms": 0.0, "error": "",
            }
            image = self._reload(row, result)
            if image is not None:
                images[row["index"]] = image
                result["data"], result["fmt"] = image.source_bytes, image.source_format or ""
        def needing(what: str) -> list[dict[str, Any]]:
            return [r for r in items if r[what] and r["index"] in images]

        self._packages(needing("need_package"), images, out)
        self._vectors(needing("need_vector"), images, out)
        self._records(needing("need_record"), images, out)
        return columns([out[row["index"]] for row in items], ENCODE_COLUMNS)

    def _reload(self, row: Mapping[str, Any], result: dict[str, Any]) -> ImageInput | None:
        """The row's image decoded again (the same pixels the hash stage saw), or None with ``result``'s error set."""
        try:
            image = load_image(Path(row["path"]), limits=self.spec.limits, name=row["path"])
            if image.sha256 != row["sha256"]:
                raise ValueError(f"{row['path']} changed while it was ingested; run the ingest again")
        except Exception as e:
            result["error"] = _error(e)
            return None
        return image

    def _each(self, todo: list[dict[str, Any]], images: dict[int, ImageInput], out: dict[int, dict], work) -> None:
        """Run ``work(rows, images)`` on ``todo``; when it fails, one row at a time so only the bad row fails."""
        todo = [row for row in todo if not out[row["index"]]["error"]]
        if not todo:
            return
        try:
            work(todo, [images[row["index"]] for row in todo])
        except Exception:
            if len(todo) == 1:
                raise
            for row in todo:
                try:
                    work([row], [images[row["index"]]])
                except Exception as e:
                    out[row["index"]]["error"] = _error(e)

    def _packages(self, todo, images, out) -> None:
        from ..cache.packages import encode_packages

        def work(batch_rows, batch_images):
            backend = self.backend()
            size = max(1, backend.batch_size)
            for start in range(0, len(batch_rows), size):
                chunk = batch_images[start : start + size]
                clock = time.perf_counter()
                packages = encode_packages(backend, chunk, self.spec.scope)
                spent = (time.perf_counter() - clock) * 1000 / len(chunk)
                self.encodes += len(packages)
                for row, package in zip(batch_rows[start : start + size], packages):
                    out[row["index"]]["package"] = pickle.dumps(package, protocol=pickle.HIGHEST_PROTOCOL)
                    out[row["index"]]["encode_ms"] = package.encode_ms or spent

        self._guarded(todo, images, out, work)

    def _vectors(self, todo, images, out) -> None:
        def work(batch_rows, batch_images):
            for row, vector in zip(batch_rows, self.embedder().embed_images(batch_images)):
                out[row["index"]]["vector"] = np.asarray(vector, dtype=np.float32).tobytes()

        self._guarded(todo, images, out, work)

    def _records(self, todo, images, out) -> None:
        from ..judge.attribute_schema import ERROR_KEY

        def work(batch_rows, batch_images):
            for row, record in zip(batch_rows, self.imagenet().compute(batch_images)):
                if ERROR_KEY not in record:  # a failed record is not stored (a later run computes it)
                    out[row["index"]]["record"] = json.dumps(record)

        self._guarded(todo, images, out, work)

    def _guarded(self, todo, images, out, work) -> None:
        try:
            self._each(todo, images, out, work)
        except Exception as e:  # the single-row retry failed too
            for row in todo:
                if not out[row["index"]]["error"]:
                    out[row["index"]]["error"] = _error(e)
