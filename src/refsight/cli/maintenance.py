"""The store's upkeep: ``stats``, ``verify``, ``reencode``, ``index``, ``prune``, ``gc``."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from .arguments import EMBEDDER_HELP, Command, UsageError
from .command import emit, open_engine
from .tables import format_ms, iso_time, model_name, percent, size, table

__all__ = ["COMMANDS"]


def cmd_stats(args: argparse.Namespace) -> int:
    """refsight stats"""
    with open_engine(args) as engine:
        data = engine.stats().to_dict()
    emit(args, data, format_stats)
    return 0


def format_stats(d: dict[str, Any]) -> str:
    """``refsight stats`` for people: what the cache did (hit rate, encodes avoided, time saved, prefix reuse)."""
    lines = [
        f"references        {d['references']}",
        f"packages          {d['packages']} ({on_disk(d['bytes'], d.get('raw_bytes'))}; {size(d['memory_bytes'])} in memory)",
        f"remembered images {d.get('remembered', 0)} ({size(d.get('remembered_bytes', 0))}: images sent inline and kept)",
    ]
    if d["hits"] is None:  # a tenant's view: the store-wide counters are not its to see
        return "\n".join(lines)
    hits, misses = d["hits"], d["misses"]
    lines += [
        f"package cache     hit rate {percent(hits, hits + misses)} ({hits} hits, {misses} encodes)",
        f"encodes avoided   {hits}: {format_ms(d['encode_ms_saved'])} of encoder time saved"
        + (f", for {format_ms(d['load_ms'] or 0)} spent loading packages" if hits else ""),
    ]
    prefix_hits, prefix_misses = d["prefix_hits"], d["prefix_misses"]
    lines.append(
        f"KV prefix cache   hit rate {percent(prefix_hits, prefix_hits + prefix_misses)} ({prefix_hits} reused, "
        f"{prefix_misses} built): {d.get('prefix_tokens_reused') or 0} prompt tokens not prefilled again, "
        f"{format_ms(d['prefix_ms_saved'])} saved; {on_disk(d['prefix_bytes'], d.get('prefix_raw_bytes'))}"
    )
    quota = "none" if d["max_package_bytes"] is None else size(d["max_package_bytes"])
    lines.append(f"byte quota        {quota} ({d['quota_evictions']} evicted, {size(d['quota_evicted_bytes'])}); "
                 f"pruned {d['pruned']}; corrupt {d['corrupt']} package(s), {d['prefix_corrupt']} prefix state(s)")
    for name, figures in (d.get("runtime_prefix_cache") or {}).items():
        lines.append(f"{name}: runtime prefix cache hit rate {percent(figures.get('hits', 0), figures.get('queries', 0))}")
    if d.get("models"):
        from ..backends.registry import available_models  # registry names only: the name that loads each model

        names = available_models()
        rows = [(model_name({"model_id": m["model"]}, names), m["hits"], format_ms(m["encode_ms_saved"] / m["hits"]), format_ms(m["load_ms"] / m["hits"]))
                for m in d["models"] if m["hits"]]
        lines += ["per model (each avoided encode against the load that replaced it):",
                  table(("model", "encodes avoided", "encode", "load"), rows, right=(1, 2, 3), indent="  ")]
    # No per-tier table: its counts are this process's, and `refsight stats` is a process that has served
    # nothing (it printed zeros). They stay in --json, and mean something in a server's /stats.
    return "\n".join(lines)


def on_disk(stored: int, raw: int | None) -> str:
    """Bytes the store keeps, and before its codec compressed them when that differs: ``1.2 MiB on disk, 2.0 MiB
    before compression (1.67x)``."""
    if not raw or raw <= stored:
        return f"{size(stored)} on disk"
    return f"{size(stored)} on disk, {size(raw)} before compression ({raw / stored:.2f}x)"


def _verify_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repair", action="store_true", help="re-encode corrupt packages from the kept images")
    p.add_argument(
        "--fresh", type=int, default=None, metavar="N",
        help="re-encode N random references with today's runtime and report drift from the stored features",
    )
    p.add_argument("--threshold", type=float, default=None, help="largest relative drift accepted with --fresh")


def cmd_verify(args: argparse.Namespace) -> int:
    """refsight verify [--repair] [--fresh N [--threshold T]]"""
    if args.fresh is not None:
        with open_engine(args) as engine:
            drift = engine.check_drift(args.fresh, model=args.model, threshold=args.threshold)
        emit(args, drift.to_dict(), lambda d: json.dumps(d, indent=2))
        return 0 if drift.ok else 1
    with open_engine(args) as engine:
        report = engine.verify(repair=args.repair, model=args.model)
    emit(args, report.to_dict(), _verify_summary)
    return 0 if report.ok else 1


def _verify_summary(d: dict[str, Any]) -> str:
    return (
        f"checked {d['checked']}, corrupt {len(d['corrupt'])}, repaired {d['repaired']}"
        + "".join(f"\n  corrupt: {k}" for k in d["corrupt"])
        + "".join(f"\n  reference without its image: {r} ({why})" for r, why in d["missing_images"].items())
    )


def cmd_reencode(args: argparse.Namespace) -> int:
    """refsight reencode --model NAME"""
    with open_engine(args) as engine:
        for result in engine.reencode(model=args.model):
            emit(args, result.to_dict(),
                 lambda d: f"{d['ref_id']:<24}  {'cached' if d['cached'] else 'encoded':<8}  "
                           f"{'-' if d['cached'] else format_ms(d['encode_ms'])}")
    return 0


def _index_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rebuild", action="store_true", help="rebuild the index files from the store")
    p.add_argument("--embedder", default=None, metavar="NAME", help=EMBEDDER_HELP)


def cmd_index(args: argparse.Namespace) -> int:
    """refsight index [--rebuild]"""
    with open_engine(args) as engine:
        data = engine.index(rebuild=args.rebuild).to_dict()
    emit(args, data, lambda d: f"{d['indexed']} references indexed with {d['embedder']} "
                               f"({d['embedded_now']} indexed now, {d['removed_now']} removed)")
    return 0


def _prune_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fingerprint", action="append", default=[], metavar="DIGEST", help="fingerprint digest (repeatable)")
    p.add_argument(
        "--model", dest="prune_models", action="append", default=[], metavar="NAME",
        help="every fingerprint of this model (its model id or registered name; repeatable)",
    )
    p.add_argument(
        "--remembered", action="store_true",
        help="forget every remembered image (an image sent inline and kept: serve --remember-images); "
             "with --dry-run, list them",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")


def cmd_prune(args: argparse.Namespace) -> int:
    """refsight prune (--fingerprint DIGEST | --model NAME)... [--dry-run]; refsight prune --remembered [--dry-run]"""
    if args.remembered:
        if args.fingerprint or args.prune_models:
            raise UsageError("--remembered forgets remembered images: give it alone, not with --fingerprint or --model")
        with open_engine(args) as engine:
            forgotten = engine.forget_remembered(all_namespaces=True, dry_run=args.dry_run)
        emit(args, forgotten.to_dict(), _format_forget)
        return 0
    with open_engine(args) as engine:
        report = engine.prune(fingerprints=args.fingerprint, models=args.prune_models, dry_run=args.dry_run)
    emit(args, report.to_dict(), _format_prune)
    return 0


def _format_forget(d: dict[str, Any]) -> str:
    if not d["images"]:
        return "no remembered image in this store"
    rows = [(i["namespace"], i["package_key"][:16], i["model_id"], size(i["bytes"]), iso_time(i["last_used"]))
            for i in d["images"]]
    listing = table(("namespace", "package", "model", "size", "last used (UTC)"), rows, right=(3,))
    if d["dry_run"]:
        return f"{listing}\n{len(rows)} remembered image(s): `refsight prune --remembered` forgets them"
    return f"{listing}\nforgot {len(rows)} remembered image(s); removed {d['packages']} package(s), {size(d['bytes'])}"


def _format_prune(d: dict[str, Any]) -> str:
    if not d["fingerprints"]:
        return "nothing to prune: no package in the store matches (`refsight prune` alone lists the fingerprints it holds)"
    rows = [(f["fingerprint_digest"][:16], f.get("backend", "?"), f.get("model_id", "?"), f["packages"], size(f["bytes"]))
            for f in d["fingerprints"]]
    listing = table(("fingerprint", "backend", "model", "packages", "size"), rows, right=(3, 4))
    if not d["keys"] and d["dry_run"]:
        return listing
    verb = "would remove" if d["dry_run"] else "removed"
    return f"{listing}\n{verb} {d['packages']} package(s), {size(d['bytes'])}; {d['links']} link(s) dropped"


def _grace_seconds(value: str) -> float:
    """``--grace``: a finite number of seconds, at least 0 (a negative grace would let gc delete what live
    writers still own; nan and inf compare false with every age)."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(f"{value!r}: give a finite number of seconds, 0 or more")
    return seconds


def _gc_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--grace", type=_grace_seconds, default=600.0, metavar="SECONDS",
        help="leave rows and temp files younger than this alone: a write may still own them (default 600)",
    )


def cmd_gc(args: argparse.Namespace) -> int:
    """refsight gc [--grace SECONDS]"""
    with open_engine(args) as engine:
        data = engine.gc(grace_s=args.grace)
    emit(args, data, lambda d: "removed " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in d.items()))
    return 0


COMMANDS = (
    Command("stats", "cache statistics", cmd_stats),
    Command("verify", "check every stored package; exit 0 only when none is corrupt", cmd_verify, _verify_arguments,
            model=True),
    Command("reencode", "encode every reference for another model", cmd_reencode, model=True),
    Command("index", "bring the retrieval index up to date with the references", cmd_index, _index_arguments),
    Command("prune", "drop the packages of models no longer used, or the remembered images (references stay)", cmd_prune,
            _prune_arguments),
    Command("gc", "remove what interrupted writes left (temp files, orphan files and rows)", cmd_gc, _gc_arguments),
)
