"""The Ray executor: the ingest stages as a Ray Data pipeline (``refsight ingest --ray``).

- hashing runs as Ray Data map tasks over blocks of paths (``hash_stage``, CPU only);
- encoding runs on an actor pool (``map_batches(EncodeStage, compute=ActorPoolStrategy(size=N))``):
  one model load per actor, ``--gpus-per-actor`` GPUs each. Ray Data restarts a killed actor and
  retries its batch (``max_restarts=-1``, ``max_task_retries=-1`` are its defaults for actor pools);
  the driver's writer is idempotent, so a batch delivered again changes nothing.
- results stream back to the driver (``iter_batches``), which writes them as they come.

The encoder fingerprint is planned by one Ray task with the actors' resources (a GPU worker may
run another dtype or kernel than the driver's CPU, and keys must be the workers').
Ray is imported only here, and only when ``--ray`` is given (``pip install 'refsight[ray]'``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from ..errors import InvalidInputError
from ..support.extras import install_command
from ..inputs.images import IntakeLimits
from ..package import EncoderFingerprint
from .runner import HASH_BATCH
from .stages import EncodeStage, StageSpec, hash_stage

__all__ = ["RayExecutor"]

#: Rows handed to the driver per batch (they carry image bytes and packages: keep it modest).
RESULT_BATCH = 32


def _import_ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise InvalidInputError("--ray", f"Ray is not installed: {install_command('ray')}") from None
    return ray


def _fingerprint(spec: StageSpec) -> EncoderFingerprint:
    return EncodeStage(spec).fingerprint()


class RayExecutor:
    """Stages on a Ray cluster: ``address`` is ``"local"`` (start one here), ``"auto"`` or ``ray://…``/``host:port``."""

    mode = "ray"

    def __init__(self, address: str = "local", *, actors: int = 1, gpus_per_actor: float = 0.0, cpus_per_actor: float = 1.0):
        if not isinstance(actors, int) or isinstance(actors, bool) or actors < 1:
            raise InvalidInputError("--actors", f"must be a positive integer, not {actors!r}")
        if gpus_per_actor < 0 or cpus_per_actor < 0:
            raise InvalidInputError("--gpus-per-actor", "resources per actor cannot be negative")
        self.ray = _import_ray()
        self.actors = actors
        self.gpus_per_actor = gpus_per_actor
        self.cpus_per_actor = cpus_per_actor
        self._started = False
        if not self.ray.is_initialized():
            # Ray's INFO lines would interleave with refsight's bar and JSON report: warnings and up only.
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING}
            if address != "local":
                kwargs["address"] = address
            try:
                self.ray.init(**kwargs)
            except (ConnectionError, RuntimeError, ValueError) as e:  # no cluster at that address, a bad address
                raise InvalidInputError("--ray", f"cannot start or join Ray at {address!r}: {e}") from None
            self._started = True  # ours to shut down
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        context = self.ray.data.DataContext.get_current()
        # refsight draws its own bar (images/s, ETA); Ray's per-operator bars would interleave with it.
        context.enable_progress_bars = False
        context.print_on_execution_start = False

    def fingerprint(self, spec: StageSpec) -> EncoderFingerprint:
        """One task with an actor's resources loads the backend and returns its fingerprint."""
        task = self.ray.remote(_fingerprint).options(num_cpus=self.cpus_per_actor, num_gpus=self.gpus_per_actor)
        return self.ray.get(task.remote(spec))

    def _dataset(self, items: list[dict[str, Any]], batch: int) -> Any:
        blocks = max(1, min(len(items) // max(1, batch) + 1, 1000))
        return self.ray.data.from_items(items, override_num_blocks=blocks)

    def hash(self, items: list[dict[str, Any]], limits: IntakeLimits) -> Iterator[dict[str, Any]]:
        """Hash-stage tasks over blocks of ``HASH_BATCH`` paths."""
        if not items:
            return
        dataset = self._dataset(items, HASH_BATCH).map_batches(
            hash_stage, fn_kwargs={"limits": limits}, batch_size=HASH_BATCH, batch_format="numpy", num_cpus=1
        )
        yield from dataset.iter_batches(batch_size=HASH_BATCH * 4, batch_format="numpy")

    def encode(self, items: list[dict[str, Any]], spec: StageSpec, batch_size: int) -> Iterator[dict[str, Any]]:
        """The encode stage on an actor pool of ``actors``, ``batch_size`` images per call."""
        if not items:
            return
        dataset = self._dataset(items, batch_size).map_batches(
            EncodeStage,
            fn_constructor_kwargs={"spec": spec},
            batch_size=batch_size,
            batch_format="numpy",
            compute=self.ray.data.ActorPoolStrategy(size=self.actors),
            num_cpus=self.cpus_per_actor,
            num_gpus=self.gpus_per_actor,
        )
        yield from dataset.iter_batches(batch_size=RESULT_BATCH, batch_format="numpy")

    def close(self) -> None:
        """Shut down the Ray instance this executor started (a cluster it joined stays up)."""
        if self._started:
            self.ray.shutdown()
            self._started = False
