"""The commands that ask the models something: ``compare``, ``search``, ``generate``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import RefsightError
from ..inputs.reading import FileReadError, read_regular_file
from ..inputs.terminal import escape_controls
from ..report import format_comparison, format_timings
from .arguments import EMBEDDER_HELP, SCHEMA_HELP, Command, parse_pairs, path_argument, text_argument
from .command import RANDOM_WEIGHTS_NOTICE, emit, open_engine

__all__ = ["COMMANDS"]

#: Largest rubric file read for ``--criteria @FILE`` (rubrics themselves are far smaller).
_MAX_CRITERIA_FILE_BYTES = 1 << 20


def _read_criteria(value: str) -> str:
    if not value.startswith("@"):
        return value
    path = value[1:]
    try:
        # A regular file only, never blocking (a FIFO) and never unbounded (/dev/zero);
        # well over any rubric's own limit, so parse_rubric reports the exact size.
        data = read_regular_file(path, _MAX_CRITERIA_FILE_BYTES)
    except FileReadError as e:
        raise RefsightError(f"--criteria {value}: cannot read {path}: {e.reason}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise RefsightError(f"--criteria {value}: {path} is not UTF-8 text") from None


def _criteria_argument(value: str) -> str:
    """The rubric as text, or ``@FILE`` (a file name: any name the OS allows)."""
    return value if value.startswith("@") else text_argument(value)


def _cache_switches(p: argparse.ArgumentParser, *, outcome: str) -> None:
    p.add_argument("--no-cache", action="store_true", help=f"re-encode the references from their kept images{outcome}")
    p.add_argument(
        "--no-prefix-states", dest="prefix_states", action="store_false",
        help=f"prefill the references' prompt prefix afresh (no stored prefix state){outcome}",
    )


def _compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("candidate", metavar="CANDIDATE", type=path_argument)
    p.add_argument("--ref", action="append", default=[], metavar="ID", help="reference id (repeatable)")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="recall K references by retrieval first")
    p.add_argument(
        "--recall", choices=("image", "text", "both"), default=None,
        help="recall query: the candidate image, the text (--query, else the rubric) or both (default; text with --query)",
    )
    p.add_argument("--query", default=None, help="recall by this text instead of the rubric")
    p.add_argument("--rerank", type=int, default=None, metavar="N", help="recall N, rerank them, judge the --top-k best")
    p.add_argument(
        "--recall-k", type=int, default=None, metavar="D",
        help="recall D (default: N of --rerank, else K); the best N by recall score are reranked",
    )
    p.add_argument(
        "--reranker", choices=("vlm", "embedding"), default="vlm",
        help="vlm: P(yes) of the model in one forward pass (default); embedding: cosine under the embedder",
    )
    p.add_argument("--attribute-schema", metavar="FILE", default=None, type=path_argument, help=SCHEMA_HELP)
    p.add_argument("--embedder", default=None, metavar="NAME", help=EMBEDDER_HELP)
    p.add_argument(
        "--criteria", required=True, metavar="TEXT|@FILE", type=_criteria_argument, help="the rubric, or @file (text, JSON, YAML)"
    )
    _cache_switches(p, outcome=" (same verdicts, other timings)")
    p.add_argument("--force-vlm", action="store_true", help="send every criterion to the VLM, none to the attribute records")
    p.add_argument("--no-attributes", action="store_true", help="use no attribute record (every criterion goes to the VLM)")
    p.add_argument("--vlm-attributes", action="store_true", help="also fill the VLM attribute record (the attribute schema, filled by the model)")


def cmd_compare(args: argparse.Namespace) -> int:
    """refsight compare CANDIDATE (--ref ID... | --top-k K [--recall MODE] [--query TEXT] [--rerank N]) --criteria TEXT|@FILE"""
    from ..requests import CompareRequest  # here: the parser itself loads no model code

    # The arguments become ONE CompareRequest, checked there (the rules between arguments are the library's).
    request = CompareRequest(
        args.candidate, criteria=_read_criteria(args.criteria), ref_ids=args.ref, top_k=args.top_k,
        query=args.query, recall=args.recall, rerank=args.rerank, recall_k=args.recall_k, reranker=args.reranker,
        use_cache=not args.no_cache, prefix_states=args.prefix_states, force_vlm=args.force_vlm,
        attributes=[] if args.no_attributes else ["imagenet"] + (["vlm"] if args.vlm_attributes else []),
    )
    with open_engine(args) as engine:
        result = engine.compare(request)
    emit(args, result.to_dict(), format_comparison)
    return 0


def _search_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", nargs="?", default=None, metavar="TEXT")
    p.add_argument("--image", default=None, metavar="PATH", type=path_argument)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE", help="metadata filter (repeatable)")
    p.add_argument("--embedder", default=None, metavar="NAME", help=EMBEDDER_HELP)


def _parse_where(items: Sequence[str]) -> dict[str, str] | None:
    from ..retrieval.vectors import validate_where

    # Checked now (key names, at most MAX_WHERE_KEYS keys), before the index is synced.
    return validate_where(parse_pairs(items, "--where")) if items else None


def cmd_search(args: argparse.Namespace) -> int:
    """refsight search TEXT | --image PATH [--k K] [--where KEY=VALUE]"""
    from ..requests import SearchRequest  # here: the parser itself loads no model code

    request = SearchRequest(text=args.text, image=args.image, k=args.k, where=_parse_where(args.where))
    with open_engine(args) as engine:
        data = engine.search(request).to_dict()
    emit(args, data, lambda d: "\n".join(f"{r['score']:.4f}  {r['ref_id']}" for r in d["results"]) or "no references match")
    return 0


def _generate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ref", action="append", default=[], metavar="ID", help="reference id (repeatable)")
    p.add_argument("--image", metavar="CANDIDATE", type=path_argument, help="a fresh candidate image")
    p.add_argument("--prompt", required=True)
    _cache_switches(p, outcome="")
    p.add_argument("--max-new-tokens", type=int, default=64)


def cmd_generate(args: argparse.Namespace) -> int:
    """refsight generate --ref ID... [--image CANDIDATE] --prompt TEXT [--no-cache]"""
    with open_engine(args) as engine:
        result = engine.generate(
            args.prompt, ref_ids=args.ref, candidate=args.image, use_cache=not args.no_cache,
            prefix_states=args.prefix_states, max_new_tokens=args.max_new_tokens,
        )
    data = result.to_dict()
    if data["random_weights"] and not args.json:
        print(RANDOM_WEIGHTS_NOTICE.format(model=data["model"]), file=sys.stderr)
    emit(args, data, lambda d: _generated_text(d, args.ref, args.image))
    return 0


def _generated_text(d: dict, ref_ids: Sequence[str], candidate: str | None) -> str:
    """The text, then what it was made from: each reference and the candidate apart, cache state and timings."""
    served = list(d["references_cached"])
    # references_cached pairs with the prompt's images in order: the references, then the candidate.
    states = ["from cache" if hit else "encoded now" for hit in served]
    refs = ", ".join(f"{ref} ({state})" for ref, state in zip(ref_ids, states)) or "none"
    lines = [
        # model text is data: a random-weight model emits ESC and \r as readily as letters
        escape_controls(d["text"], keep="\n\t"), "",
        f"model       {d['model']}{' (random weights: the text is meaningless)' if d['random_weights'] else ''}",
        f"references  {refs}",
    ]
    if candidate is not None:
        lines.append(f"candidate   {candidate} ({'encoded now' if len(served) <= len(ref_ids) or not served[-1] else 'from cache'})")
    lines.append(f"tokens      {d['prompt_tokens']} in the prompt ({d['cached_tokens']} image tokens from cached packages, "
                 f"{d['prefix_tokens_reused']} from a stored prefix state), {len(d['tokens'])} generated ({d['finish_reason']})")
    lines.append(f"timings     {format_timings(d['timings_ms'])}")
    return "\n".join(lines)


#: The library's names for each command's inputs → the arguments (see refsight.cli.describe_error).
_COMPARE_FIELDS = {
    "ref_ids": "--ref", "top_k": "--top-k", "rerank": "--rerank", "recall_k": "--recall-k", "query": "--query", "recall": "--recall",
    "reranker": "--reranker",
}
_SEARCH_FIELDS = {"query": "TEXT query or --image PATH", "text": "TEXT", "image": "--image", "k": "--k"}
_GENERATE_FIELDS = {"prompt": "--prompt", "max_new_tokens": "--max-new-tokens"}

COMMANDS = (
    Command("generate", "generate text from cached references and a fresh candidate", cmd_generate, _generate_arguments,
            model=True, fields=_GENERATE_FIELDS),
    Command("compare", "judge a candidate against references, criterion by criterion", cmd_compare, _compare_arguments,
            model=True, fields=_COMPARE_FIELDS),
    Command("search", "recall references by text or image", cmd_search, _search_arguments, fields=_SEARCH_FIELDS),
)
