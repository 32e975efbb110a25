"""The store's upkeep: ``stats``, ``verify``, ``reencode``, ``index``, ``prune``, ``gc``."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from .arguments import EMBEDDER_HELP, Command
from .context import emit, open_engine

__all__ = ["COMMANDS"]


def cmd_stats(args: argparse.Namespace) -> int:
    """refsight stats"""
    with open_engine(args) as engine:
        data = engine.stats().to_dict()
    emit(args, data, lambda d: "\n".join(f"{k:>16}: {v}" for k, v in d.items()))
    return 0


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
                 lambda d: f"{d['ref_id']}\t{'cached' if d['cached'] else 'encoded'}\t{d['encode_ms']:.1f} ms")
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
    p.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")


def cmd_prune(args: argparse.Namespace) -> int:
    """refsight prune (--fingerprint DIGEST | --model NAME)... [--dry-run]"""
    with open_engine(args) as engine:
        report = engine.prune(fingerprints=args.fingerprint, models=args.prune_models, dry_run=args.dry_run)
    emit(args, report.to_dict(), _format_prune)
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
    Command("prune", "drop the packages of models no longer used (references and kept images stay)", cmd_prune,
            _prune_arguments),
    Command("gc", "remove what interrupted writes left (temp files, orphan files and rows)", cmd_gc, _gc_arguments),
)
