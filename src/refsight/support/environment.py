"""Defaults that come from the environment: store location, model name, and where built models live."""

from __future__ import annotations

import os
from pathlib import Path


__all__ = [
    "DEFAULT_MODEL", "cache_path", "default_store_dir", "demo_store_dir", "default_model", "model_cache_dir", "default_replica_dir",
    "default_catalog_url", "default_redis_url", "default_remember_images", "default_api_keys", "default_api_key",
]

#: The model used when none is named: an offline random-weight Qwen2-VL, labelled as such.
DEFAULT_MODEL = "tiny-qwen2-vl"


def cache_path(variable: str, *parts: str) -> Path:
    """``$variable`` when set (``~`` expanded), else ``<user cache dir>/refsight/<parts...>``: where refsight
    keeps what it builds or derives, each place overridable by its own environment variable."""
    env = os.environ.get(variable)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir  # only when the default is needed

    return Path(user_cache_dir("refsight"), *parts)


def default_store_dir() -> Path:
    """``$REFSIGHT_STORE``, else ``<user cache dir>/refsight/store``."""
    return cache_path("REFSIGHT_STORE", "store")


def demo_store_dir() -> Path:
    """``$REFSIGHT_DEMO_STORE``, else ``<user cache dir>/refsight/demo``: the demo's photos in a store of their
    own, so they never show up among (or get recalled with) the user's references."""
    return cache_path("REFSIGHT_DEMO_STORE", "demo")


def default_model() -> str:
    """``$REFSIGHT_MODEL``, else :data:`DEFAULT_MODEL`."""
    return os.environ.get("REFSIGHT_MODEL") or DEFAULT_MODEL


def model_cache_dir() -> Path:
    """Where built models live: ``$REFSIGHT_MODEL_CACHE``, else ``<user cache dir>/refsight/models``."""
    return cache_path("REFSIGHT_MODEL_CACHE", "models")


def default_replica_dir(catalog_url: str, blob_dir: Path | str) -> Path:
    """Where a replica keeps its derived data (retrieval index, attribute records) for a shared store.

    ``$REFSIGHT_REPLICA_DIR``, else ``<user cache dir>/refsight/replicas/<digest>``, one per
    catalog URL and blob directory or ``s3://`` bucket (derived data is rebuilt from the catalog when missing).
    """
    import hashlib

    where = blob_dir if isinstance(blob_dir, str) and blob_dir.startswith("s3://") else Path(blob_dir).resolve()
    digest = hashlib.sha256(f"{catalog_url}\n{where}".encode()).hexdigest()[:16]
    return cache_path("REFSIGHT_REPLICA_DIR", "replicas", digest)


def default_catalog_url() -> str | None:
    """``$REFSIGHT_CATALOG``: the ``postgresql://`` catalog replicas share (None: the store's own SQLite catalog)."""
    return os.environ.get("REFSIGHT_CATALOG") or None


def default_redis_url() -> str | None:
    """``$REFSIGHT_REDIS``: the Redis tier's URL, ``redis://HOST:PORT/DB`` (None: no Redis tier unless configured).
    """
    return os.environ.get("REFSIGHT_REDIS") or None


def default_remember_images() -> str | None:
    """``$REFSIGHT_REMEMBER_IMAGES``: what the store keeps of images sent inline, ``off``, ``recurring`` or ``all``
    (None: unset; see :mod:`refsight.settings.remembering`)."""
    return os.environ.get("REFSIGHT_REMEMBER_IMAGES") or None


def default_api_keys() -> str:
    """``$REFSIGHT_API_KEYS``: the server's ``key=namespace`` pairs, separated by commas, semicolons or spaces
    (``""``: none; a keys file, ``refsight serve --keys FILE``, is read instead when given)."""
    return os.environ.get("REFSIGHT_API_KEYS", "")


def default_api_key() -> str:
    """``$REFSIGHT_API_KEY``: one API key for the server's default namespace (llama-server's and vLLM's
    ``--api-key``; ``""``: none). It adds to ``$REFSIGHT_API_KEYS`` or the keys file."""
    return os.environ.get("REFSIGHT_API_KEY", "")


# --- backends: each variable one meaning -------------------------------------------------

__all__ += ["hash_memo_dir", "llama_log_enabled", "llama_cpp_source", "vllm_env_dir"]


def hash_memo_dir() -> Path:
    """Where the checkpoint-hash memo lives: ``$REFSIGHT_HASH_MEMO_DIR``, else the model cache (:func:`model_cache_dir`).

    (``$REFSIGHT_REDIS`` is the Redis tier's URL; it never names this directory.)
    """
    env = os.environ.get("REFSIGHT_HASH_MEMO_DIR")
    return Path(env).expanduser() if env else model_cache_dir()


def llama_log_enabled() -> bool:
    """``$REFSIGHT_LLAMA_LOG`` set (to anything but empty, 0, false, no, off): llama.cpp keeps its own stderr log."""
    return os.environ.get("REFSIGHT_LLAMA_LOG", "").strip().lower() not in ("", "0", "false", "no", "off")


def llama_cpp_source() -> Path | None:
    """``$REFSIGHT_LLAMA_CPP_SRC``: an unpacked llama-cpp-python sdist (or its tarball) for the GGUF converter; None if unset."""
    env = os.environ.get("REFSIGHT_LLAMA_CPP_SRC")
    return Path(env).expanduser() if env else None


def vllm_env_dir() -> Path:
    """The vLLM virtual environment: ``$REFSIGHT_VLLM_ENV``, else ``<user cache dir>/refsight/vllm-env``."""
    return cache_path("REFSIGHT_VLLM_ENV", "vllm-env")
