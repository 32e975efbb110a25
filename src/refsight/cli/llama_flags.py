"""The llama-server flags ``refsight serve`` takes beyond the model and the port, and what each does here.

llama-server users keep their command lines: every flag llama-server takes has one status in
:mod:`.llama_flag_table` (honoured, accepted where it cannot change the answer, recorded for the server, or
refused by name, exit 2, before anything loads). This module parses the honoured ones that are llama-server's
alone (``--n-predict``, ``--temp``, ``--seed``, the sampler defaults ``--top-k``, ``--top-p``, ``--min-p``,
``--repeat-penalty``, ``--presence-penalty``, ``--frequency-penalty`` and ``--ignore-eos``, ``--no-ui``,
``--chat-template NAME|JINJA`` and ``--chat-template-file FILE``: the template renders every chat instead of the
model's own, and prefix states are keyed by it; ``--no-jinja``: chats render in llama.cpp's built-in format
detected from the template, as llama-server renders them without Jinja; ``--reasoning on|off|auto`` and
``--chat-template-kwargs JSON``: the template's variables every request gets unless it sets them itself
(:func:`template_defaults`); ``--api-key-file``, ``--offline``,
``--hf-token``, ``--image-min-tokens``/``--image-max-tokens``, ``-ctk``/``-ctv f16``, the KV cache's only type here)
and registers every other flag of the table (:func:`add_table_flags`), whose verdicts :func:`table_verdicts` gives
after parsing: the accepted and recorded ones are named in the startup log (:func:`log_table_flags`).

``-c`` is the whole context, shared by the ``-np`` slots as llama.cpp shares it: both the
context and each slot's share are rounded up to a multiple of 256 (``-c 256 -np 4``: four slots
of 256, as llama-server starts them); ``--kv-unified`` (llama-server's ``-kvu``) or
``--ctx-per-slot`` give each slot the whole ``-c``, and ``--kv-unified-per-slot N`` caps each slot at ``N``.
A slot's context above the one the model was trained for is capped at it with llama-server's warning.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import InvalidInputError, Sampling, __version__
from ..requests import check_template_variables
from ..settings import BUILTIN_TEMPLATES, builtin_template
from .arguments import UsageError, path_argument, text_argument
from .command import say
from .llama_flag_table import ACCEPTED, HONOURED, LLAMA_SERVER_FLAGS, RECORDED, REFUSED, LlamaFlag

__all__ = ["add_llama_server_arguments", "add_table_flags", "llama_server_settings", "table_verdicts", "log_table_flags",
           "slot_context", "chat_template", "api_keys", "apply_environment", "KV_PAD", "SAMPLER_FLAGS", "TableVerdicts"]

#: llama.cpp rounds the context, and each sequence's share of it, up to a multiple of this (``GGML_PAD(n, 256)``).
KV_PAD = 256

#: The KV cache type llama.cpp uses unless told otherwise: the only one refsight's prefix states are kept in.
_KV_TYPE = "f16"

#: llama-server's sampler flags: each sets the default of one :class:`~refsight.sampling.Sampling` field. Unset,
#: a request gets its runtime's (on llama.cpp llama-server's own: top-k 40, top-p 0.95, min-p 0.05).
SAMPLER_FLAGS = {
    "--top-k": ("top_k", int, "top-k sampling (0: off)"),
    "--top-p": ("top_p", float, "top-p sampling (1: off)"),
    "--min-p": ("min_p", float, "min-p sampling (0: off)"),
    "--repeat-penalty": ("repetition_penalty", float, "repeat penalty (1: off)"),
    "--presence-penalty": ("presence_penalty", float, "presence penalty (0: off)"),
    "--frequency-penalty": ("frequency_penalty", float, "frequency penalty (0: off)"),
}


def add_llama_server_arguments(p: argparse.ArgumentParser) -> None:
    """Add llama-server's honoured flags to ``refsight serve`` (:func:`add_table_flags` adds the rest, last)."""
    p.add_argument("--usage", action="help", help=argparse.SUPPRESS)
    p.add_argument("--version", action="version", version=f"refsight {__version__}", help="print refsight's version")
    p.add_argument("-n", "--n-predict", "--predict", dest="n_predict", type=int, metavar="N",
                   help="tokens an answer may have when the request names none (default 128; -1: up to the server limit)")
    p.add_argument("--temp", "--temperature", dest="temp", type=float, metavar="T",
                   help="default temperature (default 0: greedy)")
    p.add_argument("-s", "--seed", dest="seed", type=int, metavar="N", help="default sampling seed (-1: a fresh one)")
    for flag, (dest, kind, meaning) in SAMPLER_FLAGS.items():
        p.add_argument(flag, dest=dest, type=kind, metavar="N", help=f"default {meaning} (default: the runtime's)")
    p.add_argument("--ignore-eos", dest="ignore_eos", action="store_true", default=None,
                   help="answers go on past the end-of-generation tokens unless a request says otherwise")
    p.add_argument("--no-ui", "--no-webui", dest="no_webui", action="store_true", help="serve the API only, no page at /")
    p.add_argument("--ui", "--webui", dest="no_webui", action="store_false", help="serve the page at / (the default)")
    p.add_argument("--jinja", dest="jinja", action="store_true", default=None,
                   help="render chats with the Jinja chat template (the default, as llama-server's)")
    p.add_argument("--no-jinja", dest="jinja", action="store_false",
                   help="render chats in llama.cpp's built-in format detected from the chat template, as llama-server "
                        "renders them without Jinja")
    p.add_argument("--chat-template", dest="chat_template", type=text_argument, metavar="JINJA_TEMPLATE",
                   help="render chats in this template instead of the model's: a built-in name "
                        f"({', '.join(sorted(BUILTIN_TEMPLATES))}) or the Jinja template itself")
    p.add_argument("--chat-template-file", dest="chat_template_file", type=path_argument, metavar="FILE",
                   help="render chats in the Jinja template in FILE instead of the model's")
    p.add_argument("-rea", "--reasoning", dest="reasoning", type=text_argument, metavar="MODE",
                   help="on, off or auto: the template's enable_thinking for every request that sets none (on, auto: true; off: false; "
                        "as llama-server's, where the template reads it)")
    p.add_argument("--chat-template-kwargs", dest="chat_template_kwargs", type=text_argument, metavar="JSON",
                   help="the template's variables for every request (a JSON object), under the request's own")
    _add_model_flags(p)
    _add_serving_flags(p)


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    """llama-server's flags about the model: its files and their source, its KV cache, its images."""
    p.add_argument("-mm", dest="mmproj", type=path_argument, metavar="FILE", help="the multimodal projector (= --mmproj)")
    p.add_argument("-ctk", "--cache-type-k", dest="cache_type_k", type=text_argument, metavar="TYPE",
                   help=f"KV cache type of K: only {_KV_TYPE}")
    p.add_argument("-ctv", "--cache-type-v", dest="cache_type_v", type=text_argument, metavar="TYPE",
                   help=f"KV cache type of V: only {_KV_TYPE}")
    for bound in ("min", "max"):
        p.add_argument(f"--image-{bound}-tokens", dest=f"image_{bound}_tokens", type=int, metavar="N",
                       help=f"llama.cpp: the {bound}imum of tokens an image takes (mtmd's; default: the model's)")
    p.add_argument("--offline", action="store_true", help="no downloads from the Hugging Face hub (HF_HUB_OFFLINE)")
    p.add_argument("-hft", "--hf-token", dest="hf_token", type=text_argument, metavar="TOKEN",
                   help="the Hugging Face token for hub downloads (HF_TOKEN)")


def _add_serving_flags(p: argparse.ArgumentParser) -> None:
    """llama-server's flags about what the server serves and to whom."""
    p.add_argument("--api-key-file", dest="api_key_file", type=path_argument, metavar="FNAME",
                   help="API keys, one a line (lines starting with # are comments), as llama-server's")
    p.add_argument("--allowed-media-domains", dest="allowed_media_domains", nargs="+", metavar="DOMAIN",
                   help="fetch http(s) image URLs of these domain names (vLLM's flag; default: no URL is fetched); "
                        "a name resolving to a private or loopback address is fetched only if that IP is listed too")
    p.add_argument("--media-path", dest="media_path", type=path_argument, metavar="DIR",
                   help="serve file:// image URLs from this directory (llama-server's flag; default: none)")
    p.add_argument("--strict-model-name", dest="strict_model_name", action="store_true",
                   help="a request naming another model gets 404 model_not_found (default: the served model answers)")
    p.add_argument("--tags", dest="model_tags", default="", metavar="TAGS",
                   help="model tags, comma-separated, listed in /v1/models (informational, as llama-server's)")
    p.add_argument("--sleep-idle-seconds", dest="sleep_idle_seconds", type=float, default=-1, metavar="N",
                   help="unload the model after N seconds without a request; the next request loads it again "
                        "(as llama-server's; default -1: never)")
    p.add_argument("--ctx-per-slot", dest="ctx_per_slot", action="store_true",
                   help="-c is each slot's context (default: the whole context, shared by the -np slots)")
    p.add_argument("-kvu", "--kv-unified", dest="kv_unified", action="store_true",
                   help="each -np slot may fill the whole -c, as llama-server's -kvu (here each slot keeps its own "
                        "-c positions: the memory of -c per slot)")
    p.add_argument("-no-kvu", "--no-kv-unified", dest="kv_unified", action="store_false",
                   help="the -np slots share -c (the default)")
    p.add_argument("--kv-unified-per-slot", dest="kv_unified_per_slot", type=int, metavar="N",
                   help="each slot's context at most N (without -c: N each), as llama-server's")


# ------------------------------------------------------------------ every other flag of the table


class _TableFlag(argparse.Action):
    """A flag of :data:`LLAMA_SERVER_FLAGS` refsight does not parse itself: the spelling typed, its value and the
    flag's row are kept (in order, in ``llama_server_flags``) for :func:`table_verdicts`."""

    def __init__(self, *args: Any, flag: LlamaFlag, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flag = flag

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        value = " ".join(values) if isinstance(values, list) else (values or "")
        given = (option_string or self.option_strings[0], value, self.flag)
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or ()), given])


def add_table_flags(p: argparse.ArgumentParser) -> None:
    """Register every spelling of the table's flags that ``p`` does not parse already (call it last)."""
    known = set(p._option_string_actions)
    for flag in LLAMA_SERVER_FLAGS:
        spellings = [s for s in flag.spellings if s not in known]
        if flag.status == HONOURED or not spellings:
            continue
        p.add_argument(*spellings, dest="llama_server_flags", action=_TableFlag, flag=flag, default=[],
                       help=argparse.SUPPRESS, nargs={0: 0, 1: None}.get(flag.values, flag.values),
                       metavar=flag.value.split() or None, **({"type": text_argument} if flag.values else {}))


@dataclass(frozen=True)
class TableVerdicts:
    """What the table's flags given come to: those accepted (as typed, with their row) and those recorded
    (:attr:`LlamaFlag.name` → the value, or True/False for a switch's spellings)."""

    accepted: tuple[tuple[str, LlamaFlag], ...] = ()
    recorded: dict[str, Any] = field(default_factory=dict)
    recorded_rows: tuple[tuple[str, LlamaFlag], ...] = ()


def _neutral(flag: LlamaFlag, spelling: str, value: str) -> bool:
    """Whether ``spelling value`` is one of the flag's values (or spellings) that change nothing here."""
    if not flag.values:
        return spelling in flag.neutral
    for neutral in flag.neutral:
        try:
            if float(value) == float(neutral):
                return True
        except ValueError:
            if value == neutral:
                return True
    return False


def table_verdicts(args: argparse.Namespace) -> TableVerdicts:
    """The verdict on each table flag given; UsageError naming the first refused one and the reason."""
    accepted, recorded_rows, recorded = [], [], {}
    for spelling, value, flag in getattr(args, "llama_server_flags", None) or ():
        typed = f"{spelling} {value}".strip()
        if flag.status == ACCEPTED or _neutral(flag, spelling, value):
            accepted.append((typed, flag))
        elif flag.status == REFUSED:
            raise UsageError(f"{typed}: not supported: {flag.why}")
        elif flag.status == RECORDED:
            recorded_rows.append((typed, flag))
            recorded[flag.name] = value if flag.values else not spelling.lstrip("-").startswith("no")
    return TableVerdicts(tuple(accepted), recorded, tuple(recorded_rows))


def log_table_flags(verdicts: TableVerdicts) -> None:
    """The startup log's lines for the accepted and recorded flags: one a reason, naming the flags as typed."""
    for what, rows in (("accepted, no effect here", verdicts.accepted), ("recorded, not yet served", verdicts.recorded_rows)):
        by_reason: dict[str, list[str]] = {}
        for typed, flag in rows:
            by_reason.setdefault(flag.why, []).append(typed)
        for why, typed in by_reason.items():
            say(f"refsight serve: llama-server's {', '.join(typed)}: {what} ({why})")


# ------------------------------------------------------------------ what the honoured flags set


def chat_template(args: argparse.Namespace) -> str | None:
    """The template that replaces the model's (``--chat-template NAME|JINJA``, ``--chat-template-file``): its Jinja,
    or with ``--no-jinja`` the name or text llama.cpp's format detection reads; None; UsageError for a name not
    served, an unreadable file or both flags."""
    if args.chat_template is not None and args.chat_template_file is not None:
        raise UsageError("--chat-template and --chat-template-file both name a template; give one")
    if args.chat_template_file is not None:
        try:
            text = Path(args.chat_template_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--chat-template-file {args.chat_template_file}: cannot read it: {e}") from None
        if not text.strip():
            raise UsageError(f"--chat-template-file {args.chat_template_file}: the file is empty")
        return text
    value = args.chat_template
    if value is None or getattr(args, "jinja", None) is False or "{{" in value or "{%" in value:
        return value  # the template itself, as llama-server takes it (or, without Jinja, what it detects a format from)
    try:
        return builtin_template(value.strip())
    except ValueError as e:
        raise UsageError(f"--chat-template: {e}") from None


def api_keys(args: argparse.Namespace) -> str | None:
    """The API keys of ``--api-key`` (repeated or comma-separated) and ``--api-key-file``, comma-separated; None."""
    keys = list(args.api_key or ())
    if args.api_key_file is not None:
        try:
            lines = Path(args.api_key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--api-key-file {args.api_key_file}: cannot read it: {e}") from None
        keys += [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    return ",".join(keys) if keys else None


def apply_environment(args: argparse.Namespace) -> None:
    """``--offline`` and ``--hf-token``: the Hugging Face hub's own settings, for the model downloads they govern."""
    if args.offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    if args.hf_token:
        os.environ["HF_TOKEN"] = args.hf_token


def mtmd_settings(args: argparse.Namespace) -> dict[str, int]:
    """``--image-min-tokens``/``--image-max-tokens`` as llama.cpp's image settings (set only)."""
    return {name: getattr(args, name) for name in ("image_min_tokens", "image_max_tokens") if getattr(args, name) is not None}


def _refuse(args: argparse.Namespace) -> None:
    """UsageError naming the first honoured flag whose value cannot be honoured."""
    for flag, value in (("--cache-type-k", args.cache_type_k), ("--cache-type-v", args.cache_type_v)):
        if value is not None and value.lower() != _KV_TYPE:
            raise UsageError(f"{flag} {value}: only {_KV_TYPE} is supported (the KV cache type refsight keeps prefix states in)")
    if args.sleep_idle_seconds != -1 and not 0 < args.sleep_idle_seconds < 1e9:
        raise UsageError(f"--sleep-idle-seconds {args.sleep_idle_seconds:g}: give -1 (never) or a positive number of seconds")
    if args.n_predict is not None and args.n_predict != -1 and args.n_predict < 1:
        raise UsageError(f"--n-predict {args.n_predict}: give -1 or a positive number of tokens")
    if args.kv_unified_per_slot is not None and args.kv_unified_per_slot < 1:
        raise UsageError(f"--kv-unified-per-slot {args.kv_unified_per_slot}: give a positive number of tokens")


def llama_server_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~refsight.server.ServerConfig` fields the flags set; UsageError for a refused flag."""
    _refuse(args)
    settings: dict[str, Any] = {
        "strict_model_names": args.strict_model_name, "webui": not args.no_webui,
        "allowed_media_domains": tuple(args.allowed_media_domains or ()), "media_path": args.media_path,
        "model_tags": tuple(dict.fromkeys(tag.strip() for tag in args.model_tags.split(",") if tag.strip())),
        "sleep_idle_seconds": None if args.sleep_idle_seconds == -1 else args.sleep_idle_seconds,
    }
    if args.n_predict is not None:
        settings["n_predict"] = args.n_predict
    settings["sampling_defaults"] = _sampling_defaults(args)
    settings["template_variables"] = template_defaults(args)
    return settings


#: llama-server's spellings of ``--reasoning``'s values (``common/arg.cpp``: is_truthy, is_falsey, is_autoy).
_REASONING = {**dict.fromkeys(("on", "enabled", "1", "true"), True), **dict.fromkeys(("off", "disabled", "0", "false"), False),
              "auto": True}


def template_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The template's variables every request gets unless it sets them: ``--chat-template-kwargs`` (a JSON object),
    then ``--reasoning``'s ``enable_thinking`` (``auto`` as ``on``: llama-server's auto thinks wherever the template
    can); UsageError naming the flag for a value that is neither."""
    variables: dict[str, Any] = {}
    if args.chat_template_kwargs is not None:
        try:
            variables = json.loads(args.chat_template_kwargs)
        except ValueError as e:
            raise UsageError(f"--chat-template-kwargs: not JSON: {e}") from None
        if not isinstance(variables, dict):
            raise UsageError("--chat-template-kwargs: give a JSON object of the template's variables")
    if args.reasoning is not None:
        if args.reasoning.lower() not in _REASONING:
            raise UsageError(f"--reasoning {args.reasoning}: give on, off or auto")
        variables["enable_thinking"] = _REASONING[args.reasoning.lower()]
    try:
        return check_template_variables(variables)
    except InvalidInputError as e:
        raise UsageError(f"--chat-template-kwargs: {e.reason}") from None


def _sampling_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling defaults the flags set, each checked as a request would use it (UsageError naming the flag)."""
    given = {"--temp": ("temperature", args.temp), "--seed": ("seed", args.seed), "--ignore-eos": ("ignore_eos", args.ignore_eos),
             **{flag: (dest, getattr(args, dest)) for flag, (dest, _, _) in SAMPLER_FLAGS.items()}}
    defaults = {name: value for name, value in given.values() if value is not None}
    try:
        Sampling.merged({}, defaults)
    except InvalidInputError as e:
        flag = next((flag for flag, (name, _) in given.items() if name == e.input), e.input)
        raise UsageError(f"{flag} {defaults.get(e.input)}: {e.reason}") from None
    return defaults


def _pad(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`KV_PAD` (llama.cpp's ``GGML_PAD``)."""
    return -(-n // KV_PAD) * KV_PAD


def slot_context(args: argparse.Namespace) -> int | None:
    """Each slot's context as llama.cpp sizes it: ``-c`` (or ``--max-model-len``) rounded up to a multiple of 256,
    shared by the ``-np`` slots with each share rounded up again (``llama-context.cpp``: ``n_ctx_seq =
    GGML_PAD(n_ctx / n_seq_max, 256)``); the whole ``-c`` each with ``--kv-unified`` or ``--ctx-per-slot``; at most
    ``--kv-unified-per-slot`` (which without ``-c`` is each slot's context). ``-c`` below 1 is left to the backend
    to refuse (llama.cpp's "the model's own context" is not read here)."""
    cap = getattr(args, "kv_unified_per_slot", None)
    given = args.ctx_size if args.ctx_size is not None else getattr(args, "max_model_len", None)
    if given is None or given < 1:
        return cap if given is None else given
    total = _pad(given)
    shared = not (args.ctx_per_slot or args.kv_unified or not args.parallel or args.parallel <= 1)
    each = _pad(total // args.parallel) if shared else total
    return min(each, cap) if cap else each
