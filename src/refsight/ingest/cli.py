"""``refsight ingest SOURCE``: bulk ingest from the command line (hooked in by :func:`register_commands`).

Prints a progress bar (images/s, ETA) on a terminal, then ONE JSON line, the report
``{images, added, cached, failed, encode_s, wall_s, images_per_s, actors, ...}``; refused
images go to the errors file, one JSON line each. Exit code 1 when any image was refused
(the others are stored all the same), as ``refsight add`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

__all__ = ["register_commands", "cmd_ingest"]


def cmd_ingest(args: argparse.Namespace, engine_factory: Callable[[argparse.Namespace], Any]) -> int:
    """Run the ingest the flags describe and print its report."""
    with engine_factory(args) as engine:
        report = engine.ingest(
            args.source, ray=args.ray, actors=args.actors, gpus_per_actor=args.gpus_per_actor,
            cpus_per_actor=args.cpus_per_actor,
            # --batch-size (a backend option: images per encode call) also sizes the batches workers get
            batch_size=args.batch_size or 8,
            attributes=() if args.attributes == "none" else (args.attributes,), errors_file=args.errors,
            progress=not args.json and not getattr(args, "quiet", False) and sys.stderr.isatty(),
        )
    print(json.dumps(report.to_dict()), flush=True)
    if report.failed:
        print(f"refsight: {report.failed} image(s) refused; see {report.errors_file}", file=sys.stderr)
    return 1 if report.failed else 0


def register_commands(add: Callable[..., argparse.ArgumentParser], engine_factory: Callable[[argparse.Namespace], Any]) -> None:
    """Add ``ingest`` to the CLI (``add`` is :func:`refsight.cli.build_parser`'s helper)."""
    p = add(
        "ingest", lambda args: cmd_ingest(args, engine_factory),
        "encode a large reference set once: a directory, a text file of paths or a Parquet/CSV manifest "
        "(in-process, or on a Ray cluster with --ray)", model=True,
    )
    # File names are any name the OS allows (os.fsdecode); every other value is checked as text by the parser.
    p.add_argument("source", metavar="SOURCE", type=os.fsdecode, help="a directory (recursive), a text file of paths, or a .parquet/.csv manifest")
    p.add_argument(
        "--ray", default=None, metavar="ADDRESS",
        help="run on Ray: 'local' (start a Ray instance here), 'auto' (the running cluster), or a cluster address",
    )
    p.add_argument("--actors", type=int, default=1, metavar="N", help="encoder actors (one model load each; with --ray)")
    p.add_argument("--gpus-per-actor", type=float, default=0.0, metavar="G", help="GPUs per encoder actor (with --ray)")
    p.add_argument("--cpus-per-actor", type=float, default=1.0, metavar="C", help="CPUs per encoder actor (with --ray)")
    p.add_argument(
        "--attributes", choices=("imagenet", "none"), default="imagenet",
        help="attribute record computed in the same pass (default: imagenet, the ImageNet top-5)",
    )
    p.add_argument(
        "--errors", default="ingest-errors.jsonl", metavar="FILE", type=os.fsdecode,
        help="where refused images are listed, one JSON line each (default: ingest-errors.jsonl)",
    )
    p.add_argument("--embedder", default=None, metavar="NAME", help="retrieval embedder: conse (default), clip:PATH or vlm:MODEL")
