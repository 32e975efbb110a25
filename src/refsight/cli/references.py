"""The reference commands: ``add``, ``list``, ``show``, ``remove``."""

from __future__ import annotations

import argparse
import json

from .. import escape_controls
from .arguments import SCHEMA_HELP, Command, UsageError, parse_pairs, path_argument
from .context import emit, open_engine, say, show

__all__ = ["COMMANDS"]


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("images", nargs="+", metavar="IMAGE", type=path_argument)
    p.add_argument("--id", help="reference id (one image only; default: the file name)")
    p.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE", help="metadata (repeatable)")
    p.add_argument(
        "--attributes", choices=("imagenet", "vlm", "none"), default="imagenet",
        help="attribute record computed and stored at ingest (default: imagenet, the ImageNet top-5; none: skip)",
    )
    p.add_argument("--attribute-schema", metavar="FILE", default=None, type=path_argument, help=SCHEMA_HELP)


def cmd_add(args: argparse.Namespace) -> int:
    """refsight add IMAGE... [--id ID] [--meta K=V]..."""
    if args.id and len(args.images) > 1:
        raise UsageError("--id names one reference; give one IMAGE with it")
    metadata = parse_pairs(args.meta, "--meta")  # a usage error before the store is opened
    ids = [args.id] if args.id else None
    attributes = [] if args.attributes == "none" else [args.attributes]
    failed = 0
    with open_engine(args) as engine:
        for result in engine.add_many(args.images, ids=ids, metadata=metadata, attributes=attributes):
            data = result.to_dict()
            if "error" in data:
                failed += 1
                say(f"refsight: cannot add {data['input']}: {data['error']}")
                if args.json:
                    show(json.dumps(data))
                continue
            emit(args, data, _added_line)
    return 1 if failed else 0


def _added_line(d: dict) -> str:
    return (
        f"{d['ref_id']}\t{'cached' if d['cached'] else 'encoded'}\t"
        f"{d['encode_ms']:.1f} ms\t{d['bytes']} B\t{d['package_key'][:16]}"
    )


def cmd_list(args: argparse.Namespace) -> int:
    """refsight list"""
    with open_engine(args) as engine:
        refs = [r.to_dict() for r in engine.references()]
    for ref in refs:
        if args.json:
            show(json.dumps(ref))
        else:
            meta = " ".join(f"{k}={v}" for k, v in ref["metadata"].items())
            show(f"{ref['ref_id']}\t{ref['image_sha256'][:12]}\t{len(ref['packages'])} package(s)\t{escape_controls(meta)}")
    return 0


def _id_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="ID")


def cmd_show(args: argparse.Namespace) -> int:
    """refsight show ID"""
    with open_engine(args) as engine:
        data = engine.reference(args.id).to_dict()
    emit(args, data, lambda d: json.dumps(d, indent=2))
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    """refsight remove ID"""
    with open_engine(args) as engine:
        ref = engine.remove(args.id)
    emit(args, {"removed": ref.ref_id}, lambda d: f"removed {d['removed']}")
    return 0


COMMANDS = (
    Command("add", "add reference images and encode each once", cmd_add, _add_arguments, model=True),
    Command("list", "list references", cmd_list),
    Command("show", "show one reference", cmd_show, _id_argument),
    Command("remove", "remove a reference (and packages no other reference uses)", cmd_remove, _id_argument),
)
