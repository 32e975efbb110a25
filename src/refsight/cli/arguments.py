"""The command line's shared vocabulary: a command's declaration, the options every command takes, usage errors,
and the front door for text: every argument is checked as valid Unicode unless it names a file.

Each command module declares its commands as :class:`Command` values, the parser's
arguments right beside the handler that reads them; :func:`refsight.cli.build_parser`
assembles them under the options of :func:`store_options` (every command) and
:func:`model_options` (commands that load a model).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .. import InvalidInputError, RefsightError
from ..inputs.text import check_text
from ..support.environment import default_model
from ..settings import OPTION_HELP

__all__ = [
    "Command", "CommandParser", "UsageError", "dashed", "text_argument", "path_argument", "namespace_argument", "parse_pairs", "store_options",
    "model_options", "EMBEDDER_HELP", "SCHEMA_HELP",
]

EMBEDDER_HELP = "retrieval embedder: conse (default), clip:PATH or vlm:MODEL"
SCHEMA_HELP = "VLM attribute schema: a JSON/YAML mapping of attribute name to allowed values (or null)"


class UsageError(RefsightError):
    """The command line itself is wrong (flags that do not go together): exit code 2, like argparse."""


def text_argument(value: str) -> str:
    """An argument that is text (ids, metadata, criteria, prompts, queries, names): refused, exit 2, naming
    the argument, when it is not valid Unicode (undecodable bytes reach ``sys.argv`` as lone surrogates)."""
    try:
        return check_text(value, "argument")
    except InvalidInputError as e:
        raise argparse.ArgumentTypeError(e.reason) from None


#: A namespace, by the rule of the server's keys files (``key=namespace``): what a tenant's references live in.
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def namespace_argument(value: str) -> str:
    """``--namespace``: 1-64 letters, digits and ``._-``, starting with a letter or digit (as in a keys file)."""
    if not _NAMESPACE.fullmatch(text_argument(value)):
        raise argparse.ArgumentTypeError(f"{value!r}: a namespace is 1-64 letters, digits and ._- (letter or digit first)")
    return value


def path_argument(value: str) -> str:
    """An argument that names a file or directory: any name the OS allows, undecodable bytes included."""
    return value


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose arguments are text (:func:`text_argument`) unless they declare a type.

    So a new argument is checked at the front door by default; one that names a file says so
    with ``type=path_argument``. Subcommand parsers are of this class too (argparse builds
    them with the class of the parser they hang from).
    """

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """``argparse.ArgumentParser.add_argument``, with ``type=text_argument`` for values of no declared type."""
        if kwargs.get("action", "store") in ("store", "append") and "type" not in kwargs:
            kwargs["type"] = text_argument
        return super().add_argument(*args, **kwargs)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """argparse's, but an unknown flag is refused by the command it was given to (its usage, not the top
        level's), with the closest flag that command knows."""
        self._typed = dashed(list(sys.argv[1:] if args is None else args))
        parsed, extras = self.parse_known_args(self._typed, namespace)
        if extras:
            owner = self._command_parser(getattr(parsed, "command", None))
            owner.error(unrecognized(extras, owner))
        return parsed

    def error(self, message: str) -> NoReturn:
        """argparse's usage error (exit 2), naming what the user mistyped and the closest match."""
        super().error(self._explained(message))

    def _explained(self, message: str) -> str:
        choice = _INVALID_CHOICE.search(message)
        if choice:
            typed, choices = choice.group(1), re.findall(r"'([^']*)'", choice.group(2))
            return f"{message[:choice.start()]}invalid choice: {typed!r}{did_you_mean(typed, choices)}"
        typed = getattr(self, "_typed", None)
        if typed is not None and message.startswith("the following arguments are required"):
            # argparse complains of the missing command before it gets to a flag it does not know
            unknown = [token for token in typed if token.startswith("-") and not self._knows(token)]
            if unknown:
                return unrecognized(unknown[:1], self)
        return message

    def _knows(self, token: str) -> bool:
        return token.split("=", 1)[0] in self._option_string_actions

    def _command_parser(self, command: str | None) -> argparse.ArgumentParser:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and command in action.choices:
                return action.choices[command]
        return self


def dashed(argv: list[str]) -> list[str]:
    """``argv`` with each ``--flag_name`` spelled ``--flag-name`` (llama.cpp's rule, which llama-server command
    lines rely on: ``--backend_sampling``); values, and everything after a bare ``--``, as typed."""
    out: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":
            return out + argv[i:]
        name, sep, value = token.partition("=")
        out.append(name.replace("_", "-") + sep + value if token.startswith("--") else token)
    return out


#: argparse's message for a value outside ``choices`` (a command name, a ``--reranker`` kind ...).
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


def did_you_mean(typed: str, known: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``known`` to what the user ``typed``, else the choices."""
    close = difflib.get_close_matches(typed, known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f" (choose from {', '.join(known)})"


def unrecognized(tokens: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """The usage error for flags ``parser`` does not take, with its closest flag."""
    flags = [flag for flag in parser._option_string_actions if flag.startswith("--")]
    first = tokens[0].split("=", 1)[0]
    hint = did_you_mean(first, flags) if first.startswith("-") else ""
    hint = hint if hint.startswith(";") else f"; '{parser.prog} --help' lists its options"
    return f"unrecognized arguments: {' '.join(tokens)}{hint}"


@dataclass(frozen=True)
class Command:
    """One ``refsight`` command: its name, one line of help, its handler and its arguments.

    ``model``: the command loads a model, so it takes the backend options (``--model``,
    ``--device`` ...). ``fields``: the library's names for this command's inputs mapped to
    the arguments a user types (``top_k`` → ``--top-k``), so a library error names the
    argument (and is a usage error, exit 2).
    """

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None
    model: bool = False
    fields: Mapping[str, str] = field(default_factory=dict)


def parse_pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` items as a dict; a malformed item is a usage error naming ``flag``."""
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {item!r}: expected KEY=VALUE")
        pairs[key] = value
    return pairs


#: The options every command takes: (flag, metavar, type, help); each defaults to "not given".
_STORE_OPTIONS = (
    ("--store", "DIR", path_argument, "store directory, or s3://BUCKET/PREFIX with --catalog (default: "
     "$REFSIGHT_STORE or the user cache dir)"),
    ("--catalog", "URL", text_argument,
     "postgresql://... : the catalog in PostgreSQL, shared by replicas; --store then names the shared "
     "blob directory or bucket (default: $REFSIGHT_CATALOG, else the embedded SQLite catalog in the store)"),
    ("--local-dir", "DIR", path_argument,
     "with --catalog: this replica's directory for derived data (retrieval index, attribute records) and, with "
     "a bucket, its disk cache"),
    ("--local-cache-bytes", "SIZE", text_argument,
     "with an s3:// store: the byte limit of the disk cache in --local-dir, e.g. 50GiB (default 8GiB)"),
    ("--config", "FILE", path_argument,
     "config file of backend options (default: refsight.toml in the store directory); flags override it"),
    ("--redis", "URL", text_argument,
     "Redis tier between memory and disk, e.g. redis://127.0.0.1:6379/0 (Redis >= 7; default: $REFSIGHT_REDIS, "
     "else [store] redis in refsight.toml)"),
    ("--max-package-bytes", "SIZE", text_argument,
     "byte quota on packages (their stored, compressed bytes), e.g. 20GiB: least recently used ones are evicted "
     "(re-encoded when needed)"),
    ("--namespace", "NAME", namespace_argument,
     "the references' namespace (default: 'default', the one a server without API keys serves; with keys, "
     "each key's namespace); verify, prune and gc work on the whole store"),
)


def store_options() -> argparse.ArgumentParser:
    """The options every command takes: where the store is, how to print, the config file, the tiers."""
    common = CommandParser(add_help=False)
    for flag, metavar, kind, help_text in _STORE_OPTIONS:
        # SUPPRESS: given before or after the command, the one the user typed wins (see cli._resolve_store_options).
        common.add_argument(flag, metavar=metavar, type=kind, default=argparse.SUPPRESS, help=help_text)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON lines")
    common.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress on stderr (bars and stage lines show only on a terminal anyway)")
    return common


def model_options() -> argparse.ArgumentParser:
    """``--model`` and one flag per backend option (:data:`refsight.settings.OPTION_HELP`)."""
    with_model = CommandParser(add_help=False)
    with_model.add_argument("--model", default=None, help=f"model name (default: $REFSIGHT_MODEL or {default_model()})")
    for name, help_text in OPTION_HELP.items():
        if name == "processor_kwargs":
            with_model.add_argument("--processor-kwarg", action="append", default=[], metavar="KEY=VALUE", help=help_text)
        else:
            kind = int if name in ("min_pixels", "max_pixels", "batch_size") else text_argument
            metavar = "pixels|embeds" if name == "vllm_images" else None
            with_model.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None, metavar=metavar, help=help_text)
    # Not a backend option: torch's and llama.cpp's setting is the process's (refsight.support.threads).
    with_model.add_argument(
        "-t", "--threads", type=int, default=None, metavar="N",
        help="threads for llama.cpp (llama-server's -t; default: every core, it runs one thread team at a time) and "
             "per model worker for torch (default: the cores shared out among serve --workers, so workers x threads "
             "<= cores)",
    )
    return with_model
