"""The CLI reference page of the docs site, generated from the argument parser itself.

``docs/reference/cli.md`` is :func:`markdown` verbatim (a test keeps the two equal), so every
command, flag, default and help text in the docs is the parser's own: nothing to keep in step
by hand. Regenerate with ``python -m refsight.cli.reference > docs/reference/cli.md``.
"""

from __future__ import annotations

import argparse

__all__ = ["markdown", "ENVIRONMENT"]

#: The environment variables refsight reads, what each sets, and the flag it stands for (if any).
ENVIRONMENT: dict[str, str] = {
    "REFSIGHT_STORE": "the store directory every command and `refsight serve` use (`--store`)",
    "REFSIGHT_DEMO_STORE": "the store `refsight demo` uses (`--store`; default: `<user cache>/refsight/demo`, apart from "
                           "`REFSIGHT_STORE`)",
    "REFSIGHT_MODEL": "the default model (`--model`)",
    "REFSIGHT_CATALOG": "the shared catalog's PostgreSQL URL (`--catalog`)",
    "REFSIGHT_REDIS": "the Redis tier's URL, `redis://HOST:PORT/DB` (`--redis`)",
    "REFSIGHT_REMEMBER_IMAGES": "what the store keeps of images sent inline: `off`, `recurring` (the default), `all` "
                                "(`refsight serve --remember-images`)",
    "REFSIGHT_REPLICA_DIR": "a replica's private directory when the catalog is shared (default: the user cache)",
    "REFSIGHT_API_KEY": "one key `refsight serve` accepts, for the default namespace (`--api-key`)",
    "REFSIGHT_API_KEYS": "`refsight serve`'s `key=namespace` pairs, separated by commas (instead of `--keys FILE`)",
    "REFSIGHT_MODEL_CACHE": "where built-in models are built (default: `<user cache>/refsight/models`)",
    "REFSIGHT_HASH_MEMO_DIR": "where the digests of local checkpoint files are memoised (default: the model cache)",
    "REFSIGHT_LLAMA_CPP_SRC": "an unpacked llama-cpp-python sdist (or its tarball) for `convert_hf_to_gguf.py`, offline",
    "REFSIGHT_LLAMA_LOG": "llama.cpp's own log lines on stderr (`1`); off by default",
    "REFSIGHT_VLLM_ENV": "the vLLM venv `refsight vllm-env` builds and `vllm-serve` runs (default: the user cache)",
}
#: Set by refsight for its own subprocesses (the GGUF converter); not for users.
INTERNAL = ("REFSIGHT_CONVERTER_DIR", "REFSIGHT_PRE_TOKENIZER")


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
    return ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS, [], ""):
        return ""
    return f"`{action.default}`"


def _cell(text: str | None) -> str:
    return " ".join((text or "").replace("|", "\\|").split())


def _table(parser: argparse.ArgumentParser, shown: frozenset[str] = frozenset()) -> list[str]:
    """One row per argument of ``parser``, leaving out the ``shown`` ones (the flags every command takes)."""
    rows = ["| argument | default | meaning |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        if action.dest in shown:
            continue
        rows.append(f"| {_flags(action)} | {_default(action)} | {_cell(action.help)} |")
    return rows


def _llama_server_flags() -> list[str]:
    """Every flag of llama-server and what ``refsight serve`` does with it (:mod:`.llama_flag_table`)."""
    from .llama_flag_table import LLAMA_SERVER_FLAGS

    lines = ["", "## llama-server's flags", "", "`refsight serve` takes llama-server's command lines: each of its flags is "
             "honoured, accepted where it cannot change an answer here (the startup log names it), recorded for the "
             "server to honour (named in the startup log as not yet served), or refused by name (exit 2). A refused or "
             "recorded flag given a value that changes nothing here is accepted.", "",
             "| flag | refsight serve | why | accepted as |", "|---|---|---|---|"]
    for flag in LLAMA_SERVER_FLAGS:
        spelled = ", ".join(f"`{s}`" for s in flag.spellings) + (f" `{_cell(flag.value)}`" if flag.value else "")
        neutral = ", ".join(f"`{value}`" if value else "(empty)" for value in flag.neutral)
        lines.append(f"| {spelled} | {flag.status} | {_cell(flag.why)} | {neutral} |")
    return lines


def markdown() -> str:
    """The whole CLI reference page: global flags, each command's flags, the environment."""
    from . import build_parser

    parser = build_parser()
    lines = ["# CLI reference", "", "Generated from the argument parser (`python -m refsight.cli.reference`).", "",
             "## Every command", ""]
    lines += _table(parser)
    every = frozenset(a.dest for a in parser._actions)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        lines += ["", f"## refsight {name}", "", _cell(sub.description), ""]
        lines += _table(sub, every)
    lines += _llama_server_flags()
    lines += ["", "## Environment", "", "| variable | sets |", "|---|---|"]
    lines += [f"| `{name}` | {meaning} |" for name, meaning in ENVIRONMENT.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
