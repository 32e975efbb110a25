"""The llama-server flags ``refsight serve`` takes beyond the model and the port, and what each does here.

llama-server users keep their command lines: each flag is **honoured** (``--n-predict``, ``--temp``,
``--seed``, the sampler defaults ``--top-k``, ``--top-p``, ``--min-p``, ``--repeat-penalty``, ``--presence-penalty``
and ``--frequency-penalty``, ``--no-webui``, ``--api-key`` several times or comma-separated, ``--chat-template NAME|JINJA``
and ``--chat-template-file FILE``: the template renders every chat instead of the model's own, and
prefix states are keyed by it), **accepted as a no-op where that is true** (``--jinja``: chats are
always rendered with Jinja, llama-server's default; ``--metrics``: ``/metrics`` is always served, to
the operator; ``-ctk``/``-ctv f16``: the KV cache's only type here), or **refused by name** before
anything loads (``--no-jinja``, ``--slot-save-path``, other KV cache types, a name that is neither a
built-in template nor Jinja), exit 2, never silently ignored.

``-c`` is the whole context, shared by the ``-np`` slots as llama.cpp shares it: both the
context and each slot's share are rounded up to a multiple of 256 (``-c 256 -np 4``: four slots
of 256, as llama-server starts them); ``--kv-unified`` (llama-server's ``-kvu``) or
``--ctx-per-slot`` give each slot the whole ``-c``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import InvalidInputError, Sampling
from ..settings import BUILTIN_TEMPLATES, builtin_template
from .arguments import UsageError, path_argument, text_argument

__all__ = ["add_llama_server_arguments", "llama_server_settings", "slot_context", "chat_template", "KV_PAD", "SAMPLER_FLAGS"]

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
    """Add llama-server's flags to ``refsight serve``."""
    p.add_argument("-n", "--n-predict", dest="n_predict", type=int, metavar="N",
                   help="tokens an answer may have when the request names none (default 128; -1: up to the server limit)")
    p.add_argument("--temp", dest="temp", type=float, metavar="T", help="default temperature (default 0: greedy)")
    p.add_argument("--seed", dest="seed", type=int, metavar="N", help="default sampling seed (-1: a fresh one)")
    for flag, (field, kind, meaning) in SAMPLER_FLAGS.items():
        p.add_argument(flag, dest=field, type=kind, metavar="N", help=f"default {meaning} (default: the runtime's)")
    p.add_argument("--no-webui", dest="no_webui", action="store_true", help="serve the API only, no page at /")
    p.add_argument("--jinja", dest="jinja", action="store_true", default=None,
                   help="render chats with Jinja templates (the default, as llama-server's)")
    p.add_argument("--no-jinja", dest="jinja", action="store_false",
                   help="refused: refsight renders chat templates with Jinja only")
    p.add_argument("--metrics", action="store_true", help="accepted: /metrics is always served (to the operator)")
    p.add_argument("--chat-template", dest="chat_template", type=text_argument, metavar="JINJA_TEMPLATE",
                   help="render chats in this template instead of the model's: a built-in name "
                        f"({', '.join(sorted(BUILTIN_TEMPLATES))}) or the Jinja template itself")
    p.add_argument("--chat-template-file", dest="chat_template_file", type=path_argument, metavar="FILE",
                   help="render chats in the Jinja template in FILE instead of the model's")
    p.add_argument("--slot-save-path", dest="slot_save_path", type=path_argument, metavar="DIR",
                   help="refused: slots are not saved or restored (the prefix cache keeps prompt states)")
    p.add_argument("-ctk", "--cache-type-k", dest="cache_type_k", type=text_argument, metavar="TYPE",
                   help=f"KV cache type of K: only {_KV_TYPE}")
    p.add_argument("-ctv", "--cache-type-v", dest="cache_type_v", type=text_argument, metavar="TYPE",
                   help=f"KV cache type of V: only {_KV_TYPE}")
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


def chat_template(args: argparse.Namespace) -> str | None:
    """The Jinja that replaces the model's chat template (``--chat-template NAME|JINJA``, ``--chat-template-file``),
    or None; UsageError for a name not served, an unreadable file or both flags."""
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
    if value is None:
        return None
    if "{{" in value or "{%" in value:
        return value  # the template itself, as llama-server takes it
    try:
        return builtin_template(value.strip())
    except ValueError as e:
        raise UsageError(f"--chat-template: {e}") from None


def _refuse(args: argparse.Namespace) -> None:
    """UsageError naming the first flag that cannot be honoured."""
    if args.jinja is False:
        raise UsageError("--no-jinja is not supported: refsight renders chat templates with Jinja only")
    if args.slot_save_path is not None:
        raise UsageError("--slot-save-path is not supported: slots are not saved or restored "
                         "(refsight's prefix cache keeps prompt states instead)")
    for flag, value in (("--cache-type-k", args.cache_type_k), ("--cache-type-v", args.cache_type_v)):
        if value is not None and value.lower() != _KV_TYPE:
            raise UsageError(f"{flag} {value}: only {_KV_TYPE} is supported (the KV cache type refsight keeps prefix states in)")
    if args.sleep_idle_seconds != -1 and not 0 < args.sleep_idle_seconds < 1e9:
        raise UsageError(f"--sleep-idle-seconds {args.sleep_idle_seconds:g}: give -1 (never) or a positive number of seconds")
    if args.n_predict is not None and args.n_predict != -1 and args.n_predict < 1:
        raise UsageError(f"--n-predict {args.n_predict}: give -1 or a positive number of tokens")


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
    return settings


def _sampling_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling defaults the flags set, each checked as a request would use it (UsageError naming the flag)."""
    given = {"--temp": ("temperature", args.temp), "--seed": ("seed", args.seed),
             **{flag: (field, getattr(args, field)) for flag, (field, _, _) in SAMPLER_FLAGS.items()}}
    defaults = {field: value for field, value in given.values() if value is not None}
    try:
        Sampling.merged({}, defaults)
    except InvalidInputError as e:
        flag = next((flag for flag, (field, _) in given.items() if field == e.input), e.input)
        raise UsageError(f"{flag} {defaults.get(e.input)}: {e.reason}") from None
    return defaults


def _pad(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`KV_PAD` (llama.cpp's ``GGML_PAD``)."""
    return -(-n // KV_PAD) * KV_PAD


def slot_context(args: argparse.Namespace) -> int | None:
    """Each slot's context as llama.cpp sizes it: ``-c`` rounded up to a multiple of 256, shared by the
    ``-np`` slots with each share rounded up again (``llama-context.cpp``: ``n_ctx_seq = GGML_PAD(n_ctx /
    n_seq_max, 256)``); the whole ``-c`` each with ``--kv-unified`` or ``--ctx-per-slot``. ``-c`` below 1
    is left to the backend to refuse (llama.cpp's "the model's own context" is not read here)."""
    if args.ctx_size is None:
        return None
    if args.ctx_size < 1:
        return args.ctx_size
    total = _pad(args.ctx_size)
    if args.ctx_per_slot or getattr(args, "kv_unified", False) or not args.parallel or args.parallel <= 1:
        return total
    return _pad(total // args.parallel)
