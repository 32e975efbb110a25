"""The ``refsight`` command: thin over :class:`refsight.Engine`; parses, calls, prints.

Library errors become one clean message on stderr (and ``{"error": ...}`` on
stdout with ``--json``) in exactly one place, :func:`main`, with exit code 1;
usage errors exit 2, and so does a library error that names one of the command's
arguments (:func:`describe_error`): the rules about inputs live in the library only.

The commands live by concern, each command's arguments beside its handler:
:mod:`.references` (add, list, show, remove), :mod:`.judging` (compare, search,
generate), :mod:`.maintenance` (stats, verify, reencode, index, prune, gc),
:mod:`.serving` (serve) and :mod:`.models` (models, demo); ``ingest`` and the
``vllm-*`` commands come from their own packages. Model runtimes are imported only
inside the handlers that load a model, so parsing and the cheap commands stay light.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Callable

from .. import InvalidInputError, RefsightError
from ..errors import StoreConfigError
from ..support.environment import default_catalog_url, default_redis_url
from . import judging, maintenance, models, references, serving
from .arguments import CommandParser, UsageError, model_options, store_options
from .command import open_engine, say

__all__ = ["main", "build_parser", "describe_error"]

#: Every command of this package, in the order ``refsight --help`` lists them.
_COMMANDS = (*references.COMMANDS, *maintenance.COMMANDS, *judging.COMMANDS, *models.COMMANDS, *serving.COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for docs and tests)."""
    common, with_model = store_options(), model_options()
    parser = CommandParser(
        prog="refsight",
        description="Compare new images against fixed reference images with a VLM, encoding each reference once.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, func: Callable, help: str, *, model: bool = False, fields: Mapping[str, str] | None = None
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, parents=[common] + ([with_model] if model else []))
        p.set_defaults(func=func, fields=dict(fields or {}))
        return p

    for command in _COMMANDS:
        command.arguments(add(command.name, command.run, command.help, model=command.model, fields=command.fields))
    from .vllm import register_commands as add_vllm_commands  # vllm-env, vllm-serve
    from ..ingest.cli import register_commands as add_ingest_commands  # ingest

    add_vllm_commands(add)
    add_ingest_commands(add, open_engine)
    return parser


def describe_error(error: RefsightError, args: argparse.Namespace) -> tuple[str, bool]:
    """``(message, is a usage error)`` for a library error, in the command line's words.

    The library checks every rule about its inputs (one layer); when its error names an input
    that is one of the command's arguments (``top_k`` of ``compare`` is ``--top-k``), the message
    names the argument and the exit code is a usage error's. An input the library names by its
    value rather than its field (an empty query text) is named by the argument that holds it.
    """
    if isinstance(error, (UsageError, StoreConfigError)):
        return str(error), True
    fields: Mapping[str, str] = getattr(args, "fields", None) or {}
    if not isinstance(error, InvalidInputError) or not isinstance(error.input, str):
        return str(error), False
    argument = fields.get(error.input)
    if argument is None and not error.input.strip():
        argument = next((shown for dest, shown in fields.items() if getattr(args, dest, None) == error.input), None)
    if argument is None:
        return str(error), False
    return f"{argument}: {_in_flags(error.reason, fields)}", True


def _in_flags(reason: str, fields: Mapping[str, str]) -> str:
    """``reason`` with the library's field names spelled as the command's flags (``top_k`` → ``--top-k``)."""
    for field, flag in fields.items():
        if "_" in field and flag.startswith("-"):
            reason = re.sub(rf"\b{re.escape(field)}\b", flag, reason)
    return reason


def _resolve_store_options(args: argparse.Namespace) -> None:
    """The options every command takes, with their environment defaults (:mod:`refsight.support.environment`)."""
    args.store = getattr(args, "store", None)
    args.catalog = getattr(args, "catalog", None) or default_catalog_url()
    args.local_dir = getattr(args, "local_dir", None)
    args.redis = getattr(args, "redis", None) or default_redis_url()
    args.max_package_bytes = getattr(args, "max_package_bytes", None)
    args.local_cache_bytes = getattr(args, "local_cache_bytes", None)
    args.config = getattr(args, "config", None)
    args.json = getattr(args, "json", False)
    args.quiet = getattr(args, "quiet", False)
    args.namespace = getattr(args, "namespace", None)  # None: the engine's default namespace
    args.settings = None  # the config file, read at the first use (context.settings_of)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``refsight`` console script; returns the exit code."""
    # transformers draws a bar per weight load; refsight's own bars show the work that
    # matters (ingest), so silence the hub's unless the user asked for them.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    _resolve_store_options(args)
    try:
        return args.func(args)
    except RefsightError as e:
        # The one place library errors become a clean message and an exit code.
        message, usage = describe_error(e, args)
        say(f"refsight: error: {message}")
        if args.json:
            print(json.dumps({"error": message, "type": type(e).__name__}))
        return 2 if usage else 1
    except KeyboardInterrupt:
        print("refsight: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
