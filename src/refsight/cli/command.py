"""What a command runs with: the engine its flags describe, and how it prints.

Human output may carry user or model text, so its control characters are shown, not
obeyed (:func:`refsight.inputs.terminal.escape_controls`); ``--json`` prints one JSON document a line.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, Callable

from ..inputs.terminal import escape_controls
from ..inputs.text import printable_text
from ..support.environment import default_store_dir
from ..settings import OPTION_HELP, BackendOptions, Settings, apply_threads, load_settings, parse_key_values, thread_budget

if TYPE_CHECKING:
    from .. import Engine

__all__ = ["emit", "show", "say", "open_engine", "shows_progress", "backend_options", "settings_of", "RANDOM_WEIGHTS_NOTICE"]

RANDOM_WEIGHTS_NOTICE = "note: {model} has RANDOM weights; its text is meaningless (timings and caching are real)"

#: Characters the human-readable formats use for layout; every other control character is escaped.
_LAYOUT = "\n\t"


def emit(args: argparse.Namespace, data: Any, human: Callable[[Any], str] | None = None) -> None:
    """Print ``data``: as one JSON line with ``--json`` (or without a human format), else ``human(data)``."""
    if args.json or human is None:
        show(json.dumps(data, ensure_ascii=False))
    else:
        show(escape_controls(human(data), keep=_LAYOUT))


def show(text: str) -> None:
    """One line of output on stdout. A stored value that is not valid Unicode (it cannot be encoded)
    is shown with U+FFFD where its lone surrogates were, never a traceback."""
    print(printable_text(text), flush=True)


def say(message: str) -> None:
    """A message on stderr, control characters escaped (it may quote user input such as a path)."""
    print(printable_text(escape_controls(message)), file=sys.stderr)


def settings_of(args: argparse.Namespace) -> Settings:
    """The config file (``--config FILE``, else the store's ``refsight.toml``), read once per command."""
    if getattr(args, "settings", None) is None:
        args.settings = load_settings(args.store or default_store_dir(), args.config)
    return args.settings


def backend_options(args: argparse.Namespace) -> BackendOptions:
    """The backend options the user typed as flags, and only those.

    The config file's ``[backend]`` and ``[models."NAME"]`` tables are laid under them by the
    engine, for each model it loads (the one place options are merged), so a command that
    names another model never gets the default model's table.
    """
    values = {name: getattr(args, name, None) for name in OPTION_HELP if name != "processor_kwargs"}
    values["processor_kwargs"] = parse_key_values(getattr(args, "processor_kwarg", None) or [], flag="--processor-kwarg")
    return BackendOptions(**{k: v for k, v in values.items() if v is not None})


def shows_progress(args: argparse.Namespace) -> bool:
    """Progress (bars, stage lines) goes to stderr on a terminal, unless ``--json`` or ``--quiet``."""
    return not args.json and not getattr(args, "quiet", False) and sys.stderr.isatty()


def open_engine(args: argparse.Namespace) -> Engine:
    """The engine the command's flags describe (the caller closes it: ``with open_engine(args) as engine``)."""
    # Imported here, not at the top: parsing, --help and `refsight models` never pay for the pipelines.
    from .. import Engine

    # One worker here: every core is its budget, which torch and llama.cpp take by default; -t/--threads sets it.
    if getattr(args, "threads", None) is not None:
        apply_threads(thread_budget(1, args.threads), asked=args.threads)
    return Engine(
        args.store,
        catalog=args.catalog,
        local_dir=args.local_dir,
        model=getattr(args, "model", None),
        embedder=getattr(args, "embedder", None),
        attribute_schema=getattr(args, "attribute_schema", None),
        progress=shows_progress(args),
        backend_options=backend_options(args),
        settings=settings_of(args),
        redis=args.redis,
        max_package_bytes=args.max_package_bytes,
        local_cache_bytes=args.local_cache_bytes,
        **({"namespace": args.namespace} if getattr(args, "namespace", None) else {}),
    )
