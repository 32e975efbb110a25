"""refsight's encoder-cache connector for vLLM: vLLM's encoder outputs kept durably in a refsight store.

Runs inside the vLLM server (its environment, its dependencies only: torch, safetensors
and :mod:`refsight_ec_store` beside this file, which keeps the files in refsight's codec,
:mod:`refsight_codec`, with the zstandard and xxhash the environment's recipe installs). Switched on with one flag
(``refsight vllm-serve MODEL --store DIR`` adds it)::

    PYTHONPATH=<this folder> vllm serve MODEL --ec-transfer-config \\
      '{"ec_connector": "RefsightECConnector", "ec_connector_module_path": "refsight_ec_connector",
        "ec_role": "ec_both", "ec_connector_extra_config": {"store": "/path/to/refsight-store"}}'

``ec_connector_extra_config``: ``store`` (the refsight store; files go to its
``vllm-encoder/`` folder), ``bucket`` (a bucket store's ``s3://BUCKET/PREFIX``: every file goes
there too, and a miss here is looked up there, so a fleet shares its encoder outputs; configured by
the server's ``AWS_*`` environment), ``max_bytes`` (the store's byte quota, over these files and
refsight's packages together; least recently used files evicted; 0 = none) and
``fingerprint`` (anything else that changes the features, added to :func:`features_fingerprint`).

- **Only refsight reference uuids** (``refsight-`` + a 64-hex package key, derived from the
  image, the encoder fingerprint, preprocessing and tenant scope) are looked up or saved:
  an item without a uuid gets a per-process counter as its id from vLLM, and must never
  be served to another process or after a restart.
- **Checked before vLLM is told it is there**: the scheduler's lookup reads the whole file
  and checks it (:func:`refsight_ec_store.read_file`: the codec's checks, then header, size, uuid,
  fingerprint, sha256); a bad file is a miss (moved aside, counted) and vLLM encodes the item again, so a
  corrupt or truncated file never reaches ``safetensors.load`` in the worker (which would
  kill the server). The checked bytes are copied to a staging file of this server's own
  (under the temp dir, named by its engine id), which the worker reads and checks again:
  another replica's quota eviction or rewrite between the lookup and the load cannot touch
  it. The scheduler deletes a staged file only when no request it was scheduled for is
  still running, so the worker's copy is there for every load it is told to make.
- **Keyed by what changes the features**: uuid + :func:`features_fingerprint` (the model,
  its weights, dtype, vLLM version, processor settings).
- **A uuid sent with other pixels is never served the stored features**: each file carries a
  digest of the processed pixels it was encoded from; a request whose pixels for that uuid
  hash otherwise is a miss for it (counted ``refused``), and the stored file stays. (A
  uuid-only part carries no pixels to compare; vLLM's own in-memory caches trust uuids as is.)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import safetensors.torch
from refsight_ec_store import DIRNAME, ECStore, eligible, pixels_digest_of, read_file, serialize
from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorBase, ECConnectorMetadata, ECConnectorRole
from vllm.logger import init_logger

logger = init_logger("vllm.refsight_ec_connector")

__all__ = ["RefsightECConnector", "features_fingerprint"]

_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}


def features_fingerprint(vllm_config: Any, extra: str = "") -> str:
    """sha256 of what changes the encoder's outputs: the weights, dtype, vLLM version, processor settings.

    A local model folder is named by its content, not its path (replicas may mount it elsewhere):
    its config and each weight file's size, first and last MiB (two builds of random weights
    differ there; reading whole multi-GB files at every start would not pay). A hub id is named
    by itself and its revision.
    """
    import vllm

    model = vllm_config.model_config
    folder = Path(str(model.model))
    if folder.is_dir():
        weights = [_file_digest(p) for p in sorted(folder.glob("*.safetensors"))]
        config = folder / "config.json"
        identity: Any = {"config": _file_digest(config) if config.is_file() else "", "weights": weights}
    else:
        identity = {"model": str(model.model), "revision": str(model.revision or "")}
    multimodal = model.multimodal_config
    parts = {
        "identity": identity, "dtype": str(model.dtype), "vllm": vllm.__version__,
        "mm_processor_kwargs": getattr(multimodal, "mm_processor_kwargs", None) if multimodal else None,
        "extra": extra,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _file_digest(path: Path, span: int = 1 << 20) -> str:
    """sha256 of a file's name, size, first and last ``span`` bytes."""
    size = path.stat().st_size
    digest = hashlib.sha256(f"{path.name}\0{size}\0".encode())
    with open(path, "rb") as f:
        digest.update(f.read(span))
        if size > span:
            f.seek(max(span, size - span))
            digest.update(f.read(span))
    return digest.hexdigest()


def pixels_digest(item: Any) -> str:
    """sha256 of a processed item's tensors (``pixel_values``, ``image_grid_thw`` ...), by name."""
    import torch

    digest = hashlib.sha256()
    for name, value in sorted(item.get_data().items()):
        if isinstance(value, torch.Tensor):
            digest.update(name.encode() + b"\0")
            digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@dataclass
class _Loads(ECConnectorMetadata):
    """Scheduler -> worker: the uuids whose checked files the worker loads this step, and the
    pixel digests of the items it encodes (written into the files it saves)."""

    uuids: list[str] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)


class RefsightECConnector(ECConnectorBase):
    """Loads and saves vLLM's encoder outputs in a refsight store (see the module docstring)."""

    def __init__(self, vllm_config: Any, role: ECConnectorRole) -> None:
        super().__init__(vllm_config=vllm_config, role=role)
        config = vllm_config.ec_transfer_config
        store = config.get_from_extra_config("store", None)
        if not store:
            raise ValueError("RefsightECConnector needs ec_connector_extra_config.store (a refsight store folder)")
        fingerprint = features_fingerprint(vllm_config, str(config.get_from_extra_config("fingerprint", "")))
        max_bytes = int(config.get_from_extra_config("max_bytes", 0) or 0)
        bucket = config.get_from_extra_config("bucket", None)
        shared = None
        if bucket:
            from refsight_objects import ObjectStore

            shared = ObjectStore(bucket)
        self.store = ECStore(Path(store) / DIRNAME, fingerprint, max_bytes=max_bytes, shared=shared)
        # Scheduler and worker of one server share its engine id: the staging folder is theirs alone.
        self.staging = Path(tempfile.gettempdir()) / f"refsight-ec-staging-{config.engine_id}"
        self.staging.mkdir(parents=True, exist_ok=True)
        self._pending: list[str] = []
        self._digests: dict[str, Any] = {}  # uuid -> its pixels (then their digest), of the requests being scheduled
        self._saves: dict[str, str] = {}  # uuid -> pixel digest, of the items encoded this step
        self._noted: dict[str, set[str]] = {}  # request id -> uuids whose pixels were noted
        self._staged_for: dict[str, set[str]] = {}  # uuid -> ids of the running requests its staged file serves
        logger.info("refsight encoder cache (%s) at %s, fingerprint %s, quota %s bytes, staging %s",
                    role.name.lower(), self.store.root, fingerprint[:16], max_bytes or "none", self.staging)

    # -- scheduler side ---------------------------------------------------------------
    def ensure_cache_available(self, request: Any, num_computed_tokens: int) -> bool:
        """Note the pixels of each refsight item still to be prefilled (hashed only if a file or a save needs it)."""
        noted = self._noted.setdefault(request.request_id, set())
        for feature in request.mm_features:
            uuid = feature.identifier
            position = feature.mm_position
            if eligible(uuid) and uuid not in noted and feature.data is not None \
                    and num_computed_tokens < position.offset + position.length:
                self._digests[uuid] = feature.data
                noted.add(uuid)
        return True

    def _digest(self, uuid: str) -> str:
        """The pixel digest of the item now being scheduled under ``uuid`` ("" when vLLM passed no pixels)."""
        found = self._digests.get(uuid)
        if found is not None and not isinstance(found, str):
            found = self._digests[uuid] = pixels_digest(found)
        return found or ""

    def request_finished(self, request: Any) -> tuple[bool, dict[str, Any] | None]:
        """Forget the request's pixel digests and the staged files only it still needed; write its lookups'
        counts (one transaction per request, not per hit)."""
        for uuid in self._noted.pop(request.request_id, ()):
            self._digests.pop(uuid, None)
        for uuid, requests in list(self._staged_for.items()):
            requests.discard(request.request_id)
            if not requests:  # its loads are done: every step that named it ran before this request finished
                del self._staged_for[uuid]
                (self.staging / uuid).unlink(missing_ok=True)
        self.store.flush()
        return False, None

    def has_cache_item(self, identifier: str) -> bool:
        """True only for a refsight uuid whose file passed every check and was encoded from the same pixels."""
        if not self.is_consumer or not eligible(identifier):
            return False
        staged = self.staging / identifier
        if staged.exists():  # checked and staged by an earlier call, not loaded yet
            return self._same_pixels(identifier, staged.read_bytes())
        blob = self.store.load(identifier)
        if blob is None or not self._same_pixels(identifier, blob):
            return False
        temp = staged.with_name(f".{identifier}.{os.getpid()}")
        temp.write_bytes(blob)
        os.replace(temp, staged)
        return True

    def _same_pixels(self, uuid: str, blob: bytes) -> bool:
        """False (counted ``refused``) when this request's pixels for ``uuid`` differ from the file's."""
        stored = pixels_digest_of(blob)
        sent = self._digest(uuid) if stored else ""
        if sent and sent != stored:
            self.store.count(refused=1)
            logger.warning("refsight encoder cache: %s came with other pixels than its file's: not served", uuid)
            return False
        return True

    def update_state_after_alloc(self, request: Any, index: int) -> None:
        """Schedule the load of an item the lookup found, else note the pixel digest of the item vLLM encodes."""
        identifier = request.mm_features[index].identifier
        if not eligible(identifier):
            return
        staged = self.staging / identifier
        if self.is_consumer and staged.exists() and self._same_pixels(identifier, staged.read_bytes()):
            self._pending.append(identifier)
            self._staged_for.setdefault(identifier, set()).add(request.request_id)
        else:
            self._saves[identifier] = self._digest(identifier)

    def build_connector_meta(self, scheduler_output: Any) -> ECConnectorMetadata:
        """This step's loads and saves' digests (handed over and reset)."""
        meta = _Loads(self._pending, self._saves)
        self._pending, self._saves = [], {}
        return meta

    # -- worker side -----------------------------------------------------------------
    def start_load_caches(self, encoder_cache: dict[str, Any], **kwargs: Any) -> None:
        """Put each scheduled item's checked tensor into vLLM's encoder cache."""
        from vllm.platforms import current_platform

        metadata = self._get_connector_metadata()
        for uuid in getattr(metadata, "uuids", ()):
            if uuid in encoder_cache:
                continue
            # The staged copy stays until the scheduler sees the requests that need it finish.
            blob = read_file(self.staging / uuid, uuid, self.store.fingerprint)
            if blob is None:  # only a damaged private copy gets here: the store's file, checked again
                blob = read_file(self.store.path(uuid), uuid, self.store.fingerprint)
            if blob is None:
                raise RuntimeError(f"refsight encoder cache: {uuid} vanished between lookup and load")
            tensor = safetensors.torch.load(blob)["ec_cache"]
            encoder_cache[uuid] = tensor.to(current_platform.device_type)
            logger.info("refsight encoder cache: loaded %s %s", uuid, tuple(tensor.shape))

    def save_caches(self, encoder_cache: dict[str, Any], mm_hash: str, **kwargs: Any) -> None:
        """Save a freshly encoded item, when it is a refsight reference uuid (others never).

        vLLM calls this for every item its encoder ran for: the log line counts them."""
        if not self.is_producer or not eligible(mm_hash):
            logger.info("refsight encoder cache: encoded %s, not kept (not a refsight reference uuid)", mm_hash)
            return
        tensor = encoder_cache[mm_hash].detach().cpu().contiguous()
        dtype = _DTYPES.get(str(tensor.dtype).removeprefix("torch."))
        if dtype is None:
            logger.warning("refsight encoder cache: %s has dtype %s, not kept", mm_hash, tensor.dtype)
            return
        import torch

        data = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
        pixels = getattr(self._connector_metadata, "digests", {}).get(mm_hash, "")
        blob = serialize(data, dtype, [int(s) for s in tensor.shape], uuid=mm_hash, fingerprint=self.store.fingerprint,
                         pixels=pixels)
        saved = self.store.save(mm_hash, blob)
        logger.info("refsight encoder cache: encoded %s %s, %s", mm_hash, tuple(tensor.shape), "saved" if saved else "already kept")

    def shutdown(self) -> None:
        """Write the buffered counts; drop the staging folder (every save is already published when it returns)."""
        self.store.flush()
        if self.role == ECConnectorRole.SCHEDULER:
            shutil.rmtree(self.staging, ignore_errors=True)

