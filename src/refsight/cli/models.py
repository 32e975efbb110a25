"""The commands for a first look: ``models`` (what can be loaded) and ``demo`` (the guided tour)."""

from __future__ import annotations

import argparse

from ..config import default_model
from .arguments import Command, path_argument
from .context import emit

__all__ = ["COMMANDS"]


def cmd_models(args: argparse.Namespace) -> int:
    """refsight models"""
    from .. import available_models  # the registry: names only, no backend is imported

    emit(args, {"models": available_models(), "default": default_model()}, lambda d: "\n".join(d["models"]))
    return 0


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report", default=None, metavar="HTML", type=path_argument, help="also write an HTML report here")


def cmd_demo(args: argparse.Namespace) -> int:
    """refsight demo"""
    from ..demo import run_demo

    return run_demo(store=args.store, model=args.model, as_json=args.json, report=args.report)


COMMANDS = (
    Command("demo", "ingest bundled photos, compare a cat photo against them twice (cold, then cached)", cmd_demo,
            _demo_arguments, model=True),
    Command("models", "list the registered models", cmd_models),
)
