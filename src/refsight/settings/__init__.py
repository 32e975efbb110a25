"""The config file: ``refsight.toml`` in the store directory, or one named with ``--config FILE``.

::

    [backend]                      # every model
    device = "cuda"
    dtype = "bfloat16"
    batch_size = 8

    [backend.processor_kwargs]     # any image-processor setting
    do_normalize = true

    [models."hf:Qwen/Qwen2.5-VL-3B-Instruct"]   # one model; wins over [backend]
    max_pixels = 802816
    revision = "main"

    [store]                        # the package store (flags and Engine arguments win)
    redis = "redis://127.0.0.1:6379/0"   # the Redis tier between memory and disk
    local_cache_bytes = "50GiB"          # a bucket store's disk cache in --local-dir
    max_package_bytes = "50GiB"          # byte quota on packages, least recently used evicted
    memory_bytes = "2GiB"                # the process's memory tier
    remember_images = "recurring"        # images sent inline and sent again are kept: off, recurring, all

Keys are the :class:`~refsight.backends.options.BackendOptions` fields. The options
for a model are ``[backend]`` overlaid with its ``[models."NAME"]`` table; the explicit
options (command-line flags, ``Engine(backend_options=...)``) overlay both, in one place:
:meth:`Settings.backend_options`. A bad key or value is an
:class:`~refsight.errors.InvalidInputError` that names the file and the key.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..backends.options import OPTION_HELP, BackendOptions, parse_key_values
from ..backends.chat_templates import BUILTIN_TEMPLATES, builtin_template
from ..support.environment import default_store_dir
from ..errors import InvalidInputError
from ..inputs.jsonlimits import MAX_JSON_DEPTH, json_depth
from ..inputs.reading import FileReadError, read_regular_file
from .remembering import REMEMBER_IMAGES, check_remember_images
from ..store import Store, is_bucket_url, open_store, parse_bytes
from ..support.atomic import replace_atomically
from ..support.threads import apply_threads, available_cores, thread_budget, torch_threads

# The options themselves are defined beside the backends that take them; front ends (CLI,
# server) reach them here, with the config file, as one public module.
__all__ = [
    "CONFIG_NAME", "BUILTIN_TEMPLATES", "builtin_template", "Settings", "StoreSettings", "load_settings", "open_configured_store", "BackendOptions", "OPTION_HELP",
    "remember_model_options",
    "parse_key_values", "parse_bytes", "is_bucket_url", "REMEMBER_IMAGES", "apply_threads", "available_cores", "thread_budget", "torch_threads",
]

#: The file looked for in the store directory.
CONFIG_NAME = "refsight.toml"
_TABLES = ("backend", "models", "store")
_STORE_KEYS = ("redis", "max_package_bytes", "memory_bytes", "remember_images", "local_cache_bytes")


@dataclass(frozen=True)
class StoreSettings:
    """``[store]``: the Redis tier's URL, the byte quota on packages, the memory tier's budget, what is kept of
    images sent inline (:mod:`refsight.settings.remembering`), a bucket store's local disk cache."""

    redis: str | None = None
    max_package_bytes: int | None = None
    memory_bytes: int | None = None
    remember_images: str | None = None
    local_cache_bytes: int | None = None


@dataclass(frozen=True)
class Settings:
    """What a config file says: default backend options and per-model overrides."""

    #: The file read, or None when there was none.
    path: Path | None = None
    #: ``[backend]``: options for every model.
    backend: BackendOptions = field(default_factory=BackendOptions)
    #: ``[models."NAME"]``: options for one model, over ``backend``.
    models: Mapping[str, BackendOptions] = field(default_factory=dict)
    #: ``[store]``: Redis tier, quota, memory budget.
    store: StoreSettings = field(default_factory=StoreSettings)

    def backend_options(self, model: str, explicit: BackendOptions | None = None) -> BackendOptions:
        """The options for ``model``: ``[backend]``, overlaid with THAT model's ``[models."model"]``, then
        with ``explicit`` (flags, keywords: only what the caller set). The one merge of settings."""
        return self.backend.merged(self.models.get(model)).merged(explicit)

    def store_options(
        self, memory_bytes: int | None = None, redis: str | None = None, max_package_bytes: int | str | None = None,
        local_cache_bytes: int | str | None = None,
    ) -> dict[str, Any]:
        """:func:`~refsight.store.open_store` keywords: the explicit values, else ``[store]``'s."""
        options = {
            "memory_bytes": memory_bytes if memory_bytes is not None else self.store.memory_bytes,
            "redis": redis if redis is not None else self.store.redis,
            "max_package_bytes": max_package_bytes if max_package_bytes is not None else self.store.max_package_bytes,
            "local_cache_bytes": local_cache_bytes if local_cache_bytes is not None else self.store.local_cache_bytes,
        }
        return {k: v for k, v in options.items() if v is not None}


def open_configured_store(
    store: str | os.PathLike | Store | None, settings: Settings | None, memory_bytes: int | None = None,
    redis: str | None = None, max_package_bytes: int | str | None = None, local_cache_bytes: int | str | None = None,
    **options: Any,
) -> tuple[Store, Settings | None, bool]:
    """``(store, settings read for it, whether it was opened here)``: an open ``Store`` as it is; else
    the directory (default: :func:`~refsight.support.environment.default_store_dir`) or ``s3://`` bucket opened
    with the explicit options over its config file's ``[store]`` table (``options``: more
    :func:`~refsight.store.open_store` keywords), which the caller then closes. A bucket has no config
    file of its own: ``settings`` (``--config FILE``) says what it would."""
    if isinstance(store, Store):
        return store, settings, False
    root = store if is_bucket_url(store) else Path(store) if store is not None else default_store_dir()
    settings = settings if settings is not None else load_settings(None if is_bucket_url(root) else root)
    chosen = settings.store_options(memory_bytes, redis, max_package_bytes, local_cache_bytes)
    return open_store(root, **chosen, **options), settings, True


def _options(data: Any, file: Path, table: str) -> BackendOptions:
    source = f"{file} [{table}]"
    if not isinstance(data, Mapping):
        raise InvalidInputError(source, "must be a table of NAME = VALUE")
    try:
        return BackendOptions.from_mapping(data, source=source)
    except InvalidInputError as e:
        if str(e.input).startswith(str(file)):
            raise
        # A bad value: BackendOptions names the key; add where it was written.
        raise InvalidInputError(f"{source} {e.input}", e.reason) from None
    except TypeError as e:  # a value of a type no option takes (a table for device ...)
        raise InvalidInputError(source, str(e)) from None


#: Largest config file read (a real one is a few hundred bytes).
_MAX_CONFIG_BYTES = 1 << 20


def _exists(path: Path) -> bool:
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):  # ENAMETOOLONG, a NUL ...: nothing we can read there
        return False


def load_settings(store_dir: str | os.PathLike | None, path: str | os.PathLike | None = None) -> Settings:
    """Read ``path`` (it must exist), else ``<store_dir>/refsight.toml`` when there is one.

    No file is no error: the result then holds no options at all. A file that is there but is
    no regular file (a FIFO, ``/dev/zero``, a directory) is one, and says what it is.
    """
    if path is not None:
        file = Path(path).expanduser()
        if not _exists(file):
            raise InvalidInputError(str(file), "no such config file")
    elif store_dir is not None and _exists(Path(store_dir).expanduser() / CONFIG_NAME):
        file = Path(store_dir).expanduser() / CONFIG_NAME
    else:
        # (A store path the OS refuses, e.g. a name too long, is reported by open_store.)
        return Settings()
    data = _read_toml(file)
    unknown = sorted(set(data) - set(_TABLES))
    if unknown:
        raise InvalidInputError(f"{file}: {', '.join(unknown)}", f"unknown table or key; known: {', '.join(_TABLES)}")
    backend = _options(data.get("backend", {}), file, "backend")
    models_table = data.get("models", {})
    if not isinstance(models_table, Mapping):
        raise InvalidInputError(f"{file} models", 'must hold tables: [models."NAME"]')
    models = {str(name): _options(table, file, f'models."{name}"') for name, table in models_table.items()}
    return Settings(path=file, backend=backend, models=models, store=_store(data.get("store", {}), file))


def _read_toml(file: Path) -> dict[str, Any]:
    try:
        # Bounded and never blocking, like every user-named file (issue 18).
        text = read_regular_file(file, _MAX_CONFIG_BYTES).decode("utf-8")
    except FileReadError as e:
        raise InvalidInputError(str(file), f"cannot read the config file: {e.reason}") from None
    except UnicodeDecodeError as e:
        raise InvalidInputError(str(file), f"not valid TOML: {e}") from None
    # tomllib recurses once per nested array or inline table: deep nesting is refused first, as for
    # JSON (brackets in strings and comments count too, so this may only ever over-count).
    if json_depth(text, stop_above=MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise InvalidInputError(str(file), f"nested more than {MAX_JSON_DEPTH} levels deep (the limit is {MAX_JSON_DEPTH})")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InvalidInputError(str(file), f"not valid TOML: {e}") from None


def _store(data: Any, file: Path) -> StoreSettings:
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"{file} [store]", "must be a table of NAME = VALUE")
    unknown = sorted(set(data) - set(_STORE_KEYS))
    if unknown:
        raise InvalidInputError(f"{file} [store] {', '.join(unknown)}", f"unknown key; known: {', '.join(_STORE_KEYS)}")
    redis = data.get("redis")
    if redis is not None and not isinstance(redis, str):
        raise InvalidInputError(f"{file} [store] redis", f"must be a redis:// URL string, not {redis!r}")
    sizes = {
        name: parse_bytes(data[name], name=f"{file} [store] {name}", minimum=minimum) if name in data else None
        for name, minimum in (("max_package_bytes", 1), ("memory_bytes", 0), ("local_cache_bytes", 1))
    }
    remember = data.get("remember_images")
    if remember is not None:
        check_remember_images(remember, f"{file} [store] remember_images")
    return StoreSettings(redis=redis, remember_images=remember, **sizes)


def remember_model_options(store_dir: str | os.PathLike, model: str, options: BackendOptions) -> BackendOptions:
    """Write ``options`` as ``[models."MODEL"]`` into the store's ``refsight.toml`` (made when missing), so every
    later command that opens the store (``serve``, ``compare`` ...) reads the preprocessing it was filled with and
    its packages' keys match; returns the options the store now gives ``model``.

    A store whose file already has a table for ``model`` keeps it as written (whoever wrote it chose), and nothing
    is written. Numbers, strings and booleans are written; any other value is refused by name.
    """
    directory = Path(store_dir).expanduser()
    settings = load_settings(directory)
    if model in settings.models:
        return settings.backend_options(model)
    table = options.as_kwargs()
    extra = table.pop("processor_kwargs", {})
    lines = [f"[models.{_toml_value(model)}]", *(f"{name} = {_toml_value(value)}" for name, value in table.items())]
    if extra:
        lines += [f"[models.{_toml_value(model)}.processor_kwargs]", *(f"{k} = {_toml_value(v)}" for k, v in extra.items())]
    file = directory / CONFIG_NAME
    before = read_regular_file(file, _MAX_CONFIG_BYTES).decode("utf-8") if settings.path is not None else (
        "# Written when this store was first filled: the options its packages were encoded with.\n")
    text = before.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    replace_atomically(file, lambda temp: Path(temp).write_text(text, encoding="utf-8"))
    return load_settings(directory).backend_options(model)


def _toml_value(value: Any) -> str:
    """One scalar as TOML writes it (a JSON string is a TOML basic string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise InvalidInputError(f"option value {value!r}", "only numbers, strings and booleans are written to refsight.toml")
