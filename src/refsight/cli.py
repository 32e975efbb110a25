"""The ``refsight`` command: thin over :class:`refsight.Engine`; parses, calls, prints.

Library errors become one clean message on stderr (and ``{"error": ...}`` on
stdout with ``--json``) in exactly one place, :func:`main`, with exit code 1;
usage errors exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Sequence

from . import Engine, FileReadError, RefsightError, escape_controls, read_regular_file
from .settings import OPTION_HELP, BackendOptions, load_settings, parse_key_values
from .config import default_model
from .report import format_comparison

__all__ = ["main", "build_parser"]

class UsageError(RefsightError):
    """The command line itself is wrong (flags that do not go together): exit code 2, like argparse."""


RANDOM_WEIGHTS_NOTICE = "note: {model} has RANDOM weights; its text is meaningless (timings and caching are real)"


def _emit(args: argparse.Namespace, data: Any, human: Callable[[Any], str] | None = None) -> None:
    if args.json or human is None:
        print(json.dumps(data, ensure_ascii=False), flush=True)
    else:
        # Human output may carry user or model text: its control characters are shown, not obeyed.
        print(escape_controls(human(data), keep=_LAYOUT), flush=True)


#: Characters the human-readable formats use for layout; every other control character is escaped.
_LAYOUT = "\n\t"


def _say(message: str) -> None:
    """A message on stderr, control characters escaped (it may quote user input such as a path)."""
    print(escape_controls(message), file=sys.stderr)


def _parse_meta(items: Sequence[str]) -> dict[str, str]:
    meta = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--meta {item!r}: expected KEY=VALUE")
        meta[key] = value
    return meta


def _backend_options(args: argparse.Namespace) -> BackendOptions:
    """The backend options: the config file (``--config FILE`` or the store's ``refsight.toml``), then the flags."""
    from .config import default_store_dir

    values = {name: getattr(args, name, None) for name in OPTION_HELP if name != "processor_kwargs"}
    values["processor_kwargs"] = parse_key_values(getattr(args, "processor_kwarg", None) or [], flag="--processor-kwarg")
    flags = BackendOptions(**{k: v for k, v in values.items() if v is not None})
    store = getattr(args, "store", None) or default_store_dir()
    settings = load_settings(store, getattr(args, "config", None))
    # Flags win over the file; the file's [models."NAME"] table wins over its [backend].
    return settings.backend_options(getattr(args, "model", None) or default_model()).merged(flags)


def _engine(args: argparse.Namespace) -> Engine:
    from .config import default_store_dir

    return Engine(
        args.store,
        catalog=args.catalog,
        local_dir=args.local_dir,
        model=getattr(args, "model", None),
        embedder=getattr(args, "embedder", None),
        attribute_schema=getattr(args, "attribute_schema", None),
        progress=not args.json and sys.stderr.isatty(),
        backend_options=_backend_options(args),
        settings=load_settings(args.store or default_store_dir(), getattr(args, "config", None)),
        cache=args.cache,
        max_package_bytes=args.max_package_bytes,
    )


# -- commands --------------------------------------------------------------------------
def cmd_add(args: argparse.Namespace) -> int:
    """refsight add IMAGE... [--id ID] [--meta K=V]..."""
    if args.id and len(args.images) > 1:
        raise UsageError("--id names one reference; give one IMAGE with it")
    failed = 0
    with _engine(args) as engine:
        ids = [args.id] if args.id else None
        attributes = [] if args.attributes == "none" else [args.attributes]
        for result in engine.add_many(args.images, ids=ids, metadata=_parse_meta(args.meta), attributes=attributes):
            data = result.to_dict()
            if "error" in data:
                failed += 1
                _say(f"refsight: cannot add {data['input']}: {data['error']}")
                if args.json:
                    print(json.dumps(data), flush=True)
                continue
            _emit(
                args,
                data,
                lambda d: (
                    f"{d['ref_id']}\t{'cached' if d['cached'] else 'encoded'}\t"
                    f"{d['encode_ms']:.1f} ms\t{d['bytes']} B\t{d['package_key'][:16]}"
                ),
            )
    return 1 if failed else 0


def cmd_list(args: argparse.Namespace) -> int:
    """refsight list"""
    with _engine(args) as engine:
        refs = [r.to_dict() for r in engine.references()]
    if args.json:
        for ref in refs:
            print(json.dumps(ref))
    else:
        for ref in refs:
            meta = " ".join(f"{k}={v}" for k, v in ref["metadata"].items())
            print(f"{ref['ref_id']}\t{ref['image_sha256'][:12]}\t{len(ref['packages'])} package(s)\t{escape_controls(meta)}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """refsight show ID"""
    with _engine(args) as engine:
        data = engine.reference(args.id).to_dict()
    _emit(args, data, lambda d: json.dumps(d, indent=2))
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    """refsight remove ID"""
    with _engine(args) as engine:
        ref = engine.remove(args.id)
    _emit(args, {"removed": ref.ref_id}, lambda d: f"removed {d['removed']}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """refsight stats"""
    with _engine(args) as engine:
        data = engine.stats().to_dict()
    _emit(args, data, lambda d: "\n".join(f"{k:>16}: {v}" for k, v in d.items()))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """refsight verify [--repair] [--fresh N [--threshold T]]"""
    if args.fresh is not None:
        with _engine(args) as engine:
            drift = engine.check_drift(args.fresh, model=args.model, threshold=args.threshold)
        _emit(args, drift.to_dict(), lambda d: json.dumps(d, indent=2))
        return 0 if drift.ok else 1
    with _engine(args) as engine:
        report = engine.verify(repair=args.repair, model=args.model)
    data = report.to_dict()
    _emit(
        args,
        data,
        lambda d: (
            f"checked {d['checked']}, corrupt {len(d['corrupt'])}, repaired {d['repaired']}"
            + "".join(f"\n  corrupt: {k}" for k in d["corrupt"])
            + "".join(f"\n  reference without its image: {r} ({why})" for r, why in d["missing_images"].items())
        ),
    )
    return 0 if report.ok else 1


def cmd_reencode(args: argparse.Namespace) -> int:
    """refsight reencode --model NAME"""
    with _engine(args) as engine:
        for result in engine.reencode(model=args.model):
            _emit(
                args,
                result.to_dict(),
                lambda d: f"{d['ref_id']}\t{'cached' if d['cached'] else 'encoded'}\t{d['encode_ms']:.1f} ms",
            )
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """refsight generate --ref ID... [--image CANDIDATE] --prompt TEXT [--no-cache]"""
    with _engine(args) as engine:
        result = engine.generate(
            args.prompt,
            ref_ids=args.ref,
            candidate=args.image,
            use_cache=not args.no_cache,
            use_kv_cache=not args.no_kv_cache,
            max_new_tokens=args.max_new_tokens,
        )
    data = result.to_dict()
    if data["random_weights"] and not args.json:
        print(RANDOM_WEIGHTS_NOTICE.format(model=data["model"]), file=sys.stderr)
    _emit(
        args,
        data,
        lambda d: (
            f"{d['text']}\n[{d['model']}{' (random weights)' if d['random_weights'] else ''}; "
            f"references cached: {d['references_cached']}; timings ms: {d['timings_ms']}]"
        ),
    )
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    """refsight gc [--grace SECONDS]"""
    with _engine(args) as engine:
        data = engine.gc(grace_s=args.grace)
    _emit(args, data, lambda d: "removed " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in d.items()))
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """refsight prune (--fingerprint DIGEST | --model NAME)... [--dry-run]"""
    with _engine(args) as engine:
        report = engine.prune(fingerprints=args.fingerprint, models=args.prune_models, dry_run=args.dry_run)
    _emit(args, report.to_dict(), _format_prune)
    return 0


def _format_prune(d: dict[str, Any]) -> str:
    lines = [
        f"{f['fingerprint_digest'][:16]}  {f.get('backend', '?')}:{f.get('model_id', '?')}  "
        f"{f['packages']} package(s)  {f['bytes']} B"
        for f in d["fingerprints"]
    ]
    if not d["fingerprints"]:
        return "nothing to prune: no package in the store matches (`refsight prune` alone lists the fingerprints it holds)"
    if not d["keys"] and d["dry_run"]:
        return "\n".join(lines)
    verb = "would remove" if d["dry_run"] else "removed"
    return "\n".join([*lines, f"{verb} {d['packages']} package(s), {d['bytes']} B; {d['links']} link(s) dropped"])


def cmd_serve(args: argparse.Namespace) -> int:
    """refsight serve [--host 127.0.0.1] [--port 8000] [--model NAME] [--workers N] [--keys FILE] [--max-prompt-tokens N]"""
    # The HTTP stack is the optional [server] extra: without it, say how to get it (exit 2,
    # a usage-level error) instead of failing with an ImportError traceback.
    try:
        import fastapi  # noqa: F401
        import multipart  # noqa: F401  (python-multipart)
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        print(
            f"refsight: error: `refsight serve` needs the server extra ({exc.name or exc} is not installed): "
            "pip install 'refsight[server]'",
            file=sys.stderr,
        )
        return 2
    from .server import ServerConfig, serve

    serve(
        ServerConfig(
            store=args.store,
            catalog=args.catalog,
            local_dir=args.local_dir,
            model=args.model,
            backend_options=_backend_options(args),
            config_file=getattr(args, "config", None),
            host=args.host,
            port=args.port,
            workers=args.workers,
            keys_file=args.keys,
            share_encodes=args.share_encodes,
            embedder=args.embedder,
            max_prompt_tokens=args.max_prompt_tokens,
            ingest_attributes=() if args.attributes == "none" else (args.attributes,),
            cache=args.cache,
            max_package_bytes=args.max_package_bytes,
        )
    )
    return 0


def _read_criteria(value: str) -> str:
    if value.startswith("@"):
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
    return value


#: Largest rubric file read for ``--criteria @FILE`` (rubrics themselves are far smaller).
_MAX_CRITERIA_FILE_BYTES = 1 << 20


def _parse_where(items: Sequence[str]) -> dict[str, str] | None:
    from . import validate_where

    # Checked now (key names, at most MAX_WHERE_KEYS keys), before the index is synced.
    return validate_where(_parse_meta(items)) if items else None


def cmd_compare(args: argparse.Namespace) -> int:
    """refsight compare CANDIDATE (--ref ID... | --top-k K [--recall MODE] [--query TEXT] [--rerank N]) --criteria TEXT|@FILE"""
    if args.rerank is not None and args.top_k is None:
        raise UsageError("--rerank N recalls N and judges the --top-k K best: give --top-k too")
    with _engine(args) as engine:
        result = engine.compare(
            args.candidate,
            criteria=_read_criteria(args.criteria),
            ref_ids=args.ref,
            top_k=args.top_k,
            query=args.query,
            recall=args.recall,
            rerank=args.rerank,
            recall_k=args.recall_k,
            reranker=args.reranker,
            use_cache=not args.no_cache,
            use_kv_cache=not args.no_kv_cache,
            force_vlm=args.force_vlm,
            attributes=[] if args.no_attributes else ["imagenet"] + (["vlm"] if args.vlm_attributes else []),
        )
    _emit(args, result.to_dict(), format_comparison)
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    """refsight search TEXT | --image PATH [--k K] [--where KEY=VALUE]"""
    if (args.text is None) == (args.image is None):
        raise UsageError("search needs a TEXT query or --image PATH (one of them)")
    with _engine(args) as engine:
        data = engine.search(args.text, image=args.image, k=args.k, where=_parse_where(args.where)).to_dict()
    _emit(
        args,
        data,
        lambda d: "\n".join(f"{r['score']:.4f}  {r['ref_id']}" for r in d["results"]) or "no references match",
    )
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    """refsight index [--rebuild]"""
    with _engine(args) as engine:
        data = engine.index(rebuild=args.rebuild).to_dict()
    _emit(
        args,
        data,
        lambda d: f"{d['indexed']} references indexed with {d['embedder']} "
        f"({d['embedded_now']} indexed now, {d['removed_now']} removed)",
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """refsight demo"""
    from .demo import run_demo

    return run_demo(store=args.store, model=args.model, as_json=args.json, report=args.report)


def cmd_models(args: argparse.Namespace) -> int:
    """refsight models"""
    from . import available_models

    names = available_models()
    _emit(args, {"models": names, "default": default_model()}, lambda d: "\n".join(d["models"]))
    return 0


# -- parser ----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for docs and tests)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="store directory (default: $REFSIGHT_STORE or the user cache dir)",
    )
    common.add_argument(
        "--catalog",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="postgresql://... : the catalog in PostgreSQL, shared by replicas; --store then names the shared "
        "blob directory (default: $REFSIGHT_CATALOG, else the embedded SQLite catalog in the store)",
    )
    common.add_argument(
        "--local-dir",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="with --catalog: this replica's directory for derived data (retrieval index, attribute records)",
    )
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON lines")
    common.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="config file of backend options (default: refsight.toml in the store directory); flags override it",
    )
    common.add_argument(
        "--cache", metavar="URL", default=argparse.SUPPRESS,
        help="Redis tier between memory and disk, e.g. redis://127.0.0.1:6379/0 (Redis >= 7; default: $REFSIGHT_CACHE, "
        "else [store] cache in refsight.toml)",
    )
    common.add_argument(
        "--max-package-bytes", metavar="SIZE", default=argparse.SUPPRESS,
        help="byte quota on packages, e.g. 20GiB: least recently used ones are evicted (re-encoded when needed)",
    )
    with_model = argparse.ArgumentParser(add_help=False)
    with_model.add_argument("--model", default=None, help=f"model name (default: $REFSIGHT_MODEL or {default_model()})")
    for name, help_text in OPTION_HELP.items():
        if name == "processor_kwargs":
            with_model.add_argument(
                "--processor-kwarg", action="append", default=[], metavar="KEY=VALUE", help=help_text
            )
        else:
            kind = int if name in ("min_pixels", "max_pixels", "batch_size") else str
            with_model.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None, help=help_text)

    embedder_help = "retrieval embedder: conse (default), clip:PATH or vlm:MODEL"
    schema_help = "VLM attribute schema: a JSON/YAML mapping of attribute name to allowed values (or null)"
    parser = argparse.ArgumentParser(
        prog="refsight",
        description="Compare new images against fixed reference images with a VLM, encoding each reference once.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Callable, help: str, *, model: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, parents=[common] + ([with_model] if model else []))
        p.set_defaults(func=func)
        return p

    p = add("add", cmd_add, "add reference images and encode each once", model=True)
    p.add_argument("images", nargs="+", metavar="IMAGE")
    p.add_argument("--id", help="reference id (one image only; default: the file name)")
    p.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE", help="metadata (repeatable)")
    p.add_argument(
        "--attributes", choices=("imagenet", "vlm", "none"), default="imagenet",
        help="attribute record computed and stored at ingest (default: imagenet, the ImageNet top-5; none: skip)",
    )
    p.add_argument("--attribute-schema", metavar="FILE", default=None, help=schema_help)

    add("list", cmd_list, "list references")
    p = add("show", cmd_show, "show one reference")
    p.add_argument("id", metavar="ID")
    p = add("remove", cmd_remove, "remove a reference (and packages no other reference uses)")
    p.add_argument("id", metavar="ID")
    add("stats", cmd_stats, "cache statistics")
    p = add("verify", cmd_verify, "check every stored package; exit 0 only when none is corrupt", model=True)
    p.add_argument("--repair", action="store_true", help="re-encode corrupt packages from the kept images")
    p.add_argument(
        "--fresh", type=int, default=None, metavar="N",
        help="re-encode N random references with today's runtime and report drift from the stored features",
    )
    p.add_argument("--threshold", type=float, default=None, help="largest relative drift accepted with --fresh")
    p = add("reencode", cmd_reencode, "encode every reference for another model", model=True)
    p = add("generate", cmd_generate, "generate text from cached references and a fresh candidate", model=True)
    p.add_argument("--ref", action="append", default=[], metavar="ID", help="reference id (repeatable)")
    p.add_argument("--image", metavar="CANDIDATE", help="a fresh candidate image")
    p.add_argument("--prompt", required=True)
    p.add_argument("--no-cache", action="store_true", help="re-encode the references from their kept images")
    p.add_argument(
        "--no-kv-cache", action="store_true", help="prefill the references' prompt prefix afresh (no stored KV state)"
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p = add("compare", cmd_compare, "judge a candidate against references, criterion by criterion", model=True)
    p.add_argument("candidate", metavar="CANDIDATE")
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
    p.add_argument("--attribute-schema", metavar="FILE", default=None, help=schema_help)
    p.add_argument("--embedder", default=None, metavar="NAME", help=embedder_help)
    p.add_argument("--criteria", required=True, metavar="TEXT|@FILE", help="the rubric, or @file (text, JSON, YAML)")
    p.add_argument("--no-cache", action="store_true", help="re-encode the references (same verdicts, other timings)")
    p.add_argument(
        "--no-kv-cache", action="store_true", help="prefill the references' prompt prefix afresh (same verdicts, slower)"
    )
    p.add_argument("--force-vlm", action="store_true", help="send every criterion to the VLM, none to the sidecars")
    p.add_argument("--no-attributes", action="store_true", help="use no attribute sidecar")
    p.add_argument("--vlm-attributes", action="store_true", help="also fill the VLM attribute sidecar")
    p = add("search", cmd_search, "recall references by text or image")
    p.add_argument("text", nargs="?", default=None, metavar="TEXT")
    p.add_argument("--image", default=None, metavar="PATH")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE", help="metadata filter (repeatable)")
    p.add_argument("--embedder", default=None, metavar="NAME", help=embedder_help)
    p = add("index", cmd_index, "bring the retrieval index up to date with the references")
    p.add_argument("--rebuild", action="store_true", help="rebuild the index files from the store")
    p.add_argument("--embedder", default=None, metavar="NAME", help=embedder_help)
    p = add(
        "demo",
        cmd_demo,
        "ingest bundled photos, compare a cat photo against them twice (cold, then cached)",
        model=True,
    )
    p.add_argument("--report", default=None, metavar="HTML", help="also write an HTML report here")
    add("models", cmd_models, "list the registered models")
    p = add("serve", cmd_serve, "serve the HTTP API and the page (FastAPI on uvicorn)", model=True)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (non-loopback needs API keys)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=2, help="threads running model work")
    p.add_argument("--keys", metavar="FILE", help="API keys, one KEY=NAMESPACE a line (default: $REFSIGHT_API_KEYS)")
    p.add_argument(
        "--share-encodes",
        action="store_true",
        help="share packages across tenants (fewer encodes, but timing reveals that some tenant holds an image)",
    )
    p.add_argument("--embedder", default=None, metavar="NAME", help=embedder_help)
    p.add_argument(
        "--max-prompt-tokens", type=int, default=8192, metavar="N",
        help="most text tokens a chat prompt may hold (default 8192); longer prompts get 400",
    )
    p.add_argument(
        "--attributes", choices=("imagenet", "vlm", "none"), default="imagenet",
        help="attribute record computed when a reference is added over HTTP (default: imagenet; none: skip)",
    )
    p = add("prune", cmd_prune, "drop the packages of models no longer used (references and kept images stay)")
    p.add_argument("--fingerprint", action="append", default=[], metavar="DIGEST", help="fingerprint digest (repeatable)")
    p.add_argument(
        "--model", dest="prune_models", action="append", default=[], metavar="NAME",
        help="every fingerprint of this model (its model id or registered name; repeatable)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    p = add("gc", cmd_gc, "remove what interrupted writes left (temp files, orphan files and rows)")
    p.add_argument(
        "--grace", type=float, default=600.0, metavar="SECONDS",
        help="leave rows and temp files younger than this alone: a write may still own them (default 600)",
    )
    from .backends.vllm.cli import register_commands as add_vllm_commands  # vllm-env, vllm-serve
    from .ingest.cli import register_commands as add_ingest_commands  # ingest

    add_vllm_commands(add)
    add_ingest_commands(add, _engine)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``refsight`` console script; returns the exit code."""
    # transformers draws a bar per weight load; refsight's own bars show the work that
    # matters (ingest), so silence the hub's unless the user asked for them.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    args.store = getattr(args, "store", None)
    args.catalog = getattr(args, "catalog", None) or os.environ.get("REFSIGHT_CATALOG") or None
    args.local_dir = getattr(args, "local_dir", None)
    args.cache = getattr(args, "cache", None) or os.environ.get("REFSIGHT_CACHE") or None
    args.max_package_bytes = getattr(args, "max_package_bytes", None)
    args.json = getattr(args, "json", False)
    try:
        return args.func(args)
    except RefsightError as e:
        # The one place library errors become a clean message and an exit code.
        _say(f"refsight: error: {e}")
        if args.json:
            print(json.dumps({"error": str(e), "type": type(e).__name__}))
        return 2 if isinstance(e, UsageError) else 1
    except KeyboardInterrupt:
        print("refsight: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
