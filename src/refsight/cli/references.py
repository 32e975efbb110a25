"""The reference commands: ``add``, ``list``, ``show``, ``remove``."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from ..inputs.terminal import escape_controls
from .arguments import SCHEMA_HELP, Command, UsageError, parse_pairs, path_argument
from .command import emit, open_engine, say, show
from .tables import format_ms, iso_time, model_names, size, table

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
    failed, header_shown = 0, args.json  # JSON lines have no header
    with open_engine(args) as engine:
        for result in engine.add_many(args.images, ids=ids, metadata=metadata, attributes=attributes):
            data = result.to_dict()
            if "error" in data:
                failed += 1
                say(_cannot_add(data["input"], data["error"]))
                if args.json:
                    show(json.dumps(data))
                continue
            if not header_shown:
                show(_ADDED_HEADER)
                header_shown = True
            emit(args, data, _added_line)
    return 1 if failed else 0


def _cannot_add(image: str, error: str) -> str:
    """The line saying why ``image`` was not added: the path named once, and for a directory the command that
    adds every image in it."""
    reason = error.removeprefix(f"{image}: ")
    if Path(image).is_dir():
        reason = f"{reason}; to add every image in a directory, run: refsight ingest {shlex.quote(image)}"
    return f"refsight: cannot add {image}: {reason}"


#: The columns of ``add``'s lines, printed once above the first (each line is printed as its image is stored).
_ADDED_COLUMNS = (("reference", 24), ("package", 8), ("encode", 10), ("size", 10), ("package key", 0))
_ADDED_HEADER = "  ".join(name.ljust(width) for name, width in _ADDED_COLUMNS).rstrip()


def _added_line(d: dict) -> str:
    cells = (
        d["ref_id"], "cached" if d["cached"] else "encoded", "-" if d["cached"] else format_ms(d["encode_ms"]),
        size(d["bytes"]), d["package_key"][:16],
    )
    return "  ".join(str(cell).ljust(width) for cell, (_, width) in zip(cells, _ADDED_COLUMNS)).rstrip()


def cmd_list(args: argparse.Namespace) -> int:
    """refsight list"""
    with open_engine(args) as engine:
        refs = [r.to_dict() for r in engine.references(namespace=args.namespace)]
        names = model_names(engine.prune(dry_run=True).fingerprints) if refs and not args.json else {}
    if args.json:
        for ref in refs:
            show(json.dumps(ref))
        return 0
    if not refs:
        say("no references in this store and namespace (add some: refsight add IMAGE..., or run refsight demo)")
        return 0
    rows = [
        (
            ref["ref_id"], ref["image_sha256"][:12], iso_time(ref.get("created_at")),
            ", ".join(sorted(names.get(d, d[:12]) for d in ref["packages"])) or "-",
            escape_controls(" ".join(f"{k}={v}" for k, v in ref["metadata"].items())),
        )
        for ref in refs
    ]
    show(table(("reference", "image", "added (UTC)", "packages (model)", "metadata"), rows))
    return 0


def _id_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", metavar="ID")


def cmd_show(args: argparse.Namespace) -> int:
    """refsight show ID"""
    with open_engine(args) as engine:
        data = engine.reference(args.id, namespace=args.namespace).to_dict()
        names = {} if args.json else model_names(engine.prune(dry_run=True).fingerprints)
    emit(args, data, lambda d: _shown_reference(d, names))
    return 0


def _shown_reference(d: dict, names: dict[str, str]) -> str:
    """One reference for people: ISO date, metadata one a line, packages by model name."""
    lines = [
        f"reference  {d['ref_id']}",
        f"image      sha256:{d['image_sha256']}",
        f"added      {iso_time(d.get('created_at'))}",
        "metadata   " + (", ".join(f"{k}={v}" for k, v in d["metadata"].items()) or "-"),
    ]
    if d["packages"]:
        rows = [(names.get(digest, "?"), key, digest[:16]) for digest, key in d["packages"].items()]
        lines += ["packages:", table(("model", "package key", "fingerprint"), rows, indent="  ")]
    else:
        lines.append("packages   none (encoded at the next use)")
    return "\n".join(lines)


def cmd_remove(args: argparse.Namespace) -> int:
    """refsight remove ID"""
    with open_engine(args) as engine:
        ref = engine.remove(args.id, namespace=args.namespace)
    emit(args, {"removed": ref.ref_id}, lambda d: f"removed {d['removed']}")
    return 0


COMMANDS = (
    Command("add", "add reference images and encode each once", cmd_add, _add_arguments, model=True),
    Command("list", "list references", cmd_list),
    Command("show", "show one reference", cmd_show, _id_argument),
    Command("remove", "remove a reference (and packages no other reference uses)", cmd_remove, _id_argument),
)
