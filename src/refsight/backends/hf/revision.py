"""The revision that names a model's weights in every package key.

* A hub model: the **commit hash**. A branch or tag ("main", "v1.0") moves, so it is
  resolved to the commit before anything is loaded, and everything (config, weights,
  tokenizer, processor) is then loaded at that commit. Online the hub answers; offline
  (``HF_HUB_OFFLINE``, or no network) the local cache's ``refs/<name>`` file does. A
  revision that cannot be resolved is a :class:`~refsight.errors.ModelLoadError`:
  refsight never keys packages by a moving name.
* A local directory: ``sha256:`` over the names, sizes and content hashes of its weight,
  config and processor files (:func:`directory_revision`), so the same checkpoint copied
  elsewhere gives the same keys and an edited config or processor file does not.
  Per-file digests come from the cross-process memo in :mod:`.hashing`.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from ...errors import ModelLoadError
from .hashing import file_sha256

__all__ = ["directory_revision", "resolve_hub_revision", "content_files", "is_offline"]

#: Files whose bytes change the visual features: weights (and their shard index),
#: the model config and the image-processor configs. Tokenizer and generation files do not.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
CONFIG_FILES = ("config.json", "preprocessor_config.json", "processor_config.json", "image_processor_config.json")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHORT_COMMIT = re.compile(r"[0-9a-f]{7,39}")


def content_files(directory: str | os.PathLike) -> list[Path]:
    """The files of ``directory`` that :func:`directory_revision` hashes, sorted by name."""
    root = Path(directory)
    return sorted(
        p
        for p in root.iterdir()
        if p.is_file() and (p.name.endswith(WEIGHT_SUFFIXES) or p.name in CONFIG_FILES or p.name.endswith(".index.json"))
    )


def directory_revision(directory: str | os.PathLike) -> str:
    """``sha256:<hex>`` over the weight, config and processor files of a local checkpoint."""
    files = content_files(directory)
    if not any(p.name.endswith(WEIGHT_SUFFIXES) for p in files):
        raise ModelLoadError(str(directory), "no weight files (*.safetensors, *.bin) in the directory")
    h = hashlib.sha256()
    for path in files:
        # Names and sizes too: the same bytes under another shard layout are another checkpoint.
        h.update(f"{path.name}\0{path.stat().st_size}\0{file_sha256(path)}\n".encode())
    return "sha256:" + h.hexdigest()


def is_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _cached_commit(repo_id: str, revision: str) -> str | None:
    """The commit the local hub cache has for ``revision`` (a ref name or a commit prefix), or None."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    repo = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")
    ref = repo / "refs" / revision
    if ref.is_file():
        commit = ref.read_text().strip()
        return commit if _COMMIT.fullmatch(commit) else None
    if _SHORT_COMMIT.fullmatch(revision) and (repo / "snapshots").is_dir():
        matches = [p.name for p in (repo / "snapshots").iterdir() if p.name.startswith(revision)]
        if len(matches) == 1 and _COMMIT.fullmatch(matches[0]):
            return matches[0]
    return None


def resolve_hub_revision(name: str, repo_id: str, revision: str | None) -> str:
    """The commit hash of ``revision`` (default "main") of hub model ``repo_id``.

    A full commit hash is taken as is. Otherwise the hub is asked (unless offline);
    when it cannot be reached the local cache answers; when neither can, a
    :class:`ModelLoadError` says so.
    """
    revision = revision or "main"
    if _COMMIT.fullmatch(revision):
        return revision
    problem = ""
    if not is_offline():
        from huggingface_hub import HfApi
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

        try:
            sha = HfApi().model_info(repo_id, revision=revision, timeout=20).sha
            if sha and _COMMIT.fullmatch(sha):
                return sha
            problem = "the hub gave no commit for it"
        except RevisionNotFoundError as e:
            raise ModelLoadError(name, f"revision {revision!r} of {repo_id} does not exist on the hub: {e}") from None
        except (RepositoryNotFoundError, GatedRepoError) as e:
            # Private or gated: the cache may still hold it (a token-less process); else say why.
            problem = f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - no network, proxy errors ...: fall back to the cache
            problem = f"the hub is unreachable ({type(e).__name__})"
    else:
        problem = "HF_HUB_OFFLINE is set"
    commit = _cached_commit(repo_id, revision)
    if commit is not None:
        return commit
    raise ModelLoadError(
        name,
        f"cannot resolve revision {revision!r} of {repo_id} to a commit: {problem} and the model is not in the "
        "local cache (refsight keys packages by commit, never by a branch name)",
    )
