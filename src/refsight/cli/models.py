"""The commands for a first look: ``models`` (what can be loaded), ``demo`` (the guided tour) and ``samples``
(the files the README's examples use)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

from ..support.environment import default_model, default_store_dir, vllm_env_dir
from ..support.extras import install_command
from .arguments import Command, path_argument
from .command import emit, open_engine
from .tables import model_name, size, table

__all__ = ["COMMANDS", "describe_model"]

def _vllm_env() -> str:
    # What is still to do, not what once was: a built venv needs nothing more.
    if (vllm_env_dir() / "bin" / "python").exists():
        return "- (the vLLM venv is built)"
    return "refsight vllm-env (vLLM's own venv, ~3 min, 3.5 GB)"


def _llamacpp_extra() -> str:
    if importlib.util.find_spec("llama_cpp") is not None:
        return "- (llama-cpp-python is installed)"
    return f"{install_command('llamacpp')} (builds llama.cpp: 10-25 min)"


def describe_model(name: str) -> dict[str, str]:
    """What a model name is, from the name alone (nothing is loaded): its backend, whether its weights are
    real or random, and what it needs beyond ``pip install refsight``."""
    if name == "toy":
        return {"name": name, "backend": "toy", "weights": "none (a test encoder)", "needs": "-"}
    if name.startswith("hf:"):
        return {"name": name, "backend": "transformers", "weights": "real", "needs": "the checkpoint (hub id or folder)"}
    if name.startswith("llamacpp:"):
        return {"name": name, "backend": "llama.cpp", "weights": "real (the GGUF's)", "needs": _llamacpp_extra()}
    if name.startswith("vllm:"):
        # The image mode needs the server: it is asked when the model loads (shown by serve, /v1/models, /props).
        return {"name": name, "backend": "vLLM server (images: pixels or embeds, as the server supports; --vllm-images)",
                "weights": "real (the server's)", "needs": "a running vLLM server"}
    builtin = name.startswith(("tiny-", "shape-"))
    weights = "random" if builtin else "?"
    if name.endswith("-vllm"):
        return {"name": name, "backend": "vLLM", "weights": weights, "needs": _vllm_env()}
    if "-gguf" in name:
        return {"name": name, "backend": "llama.cpp", "weights": weights, "needs": _llamacpp_extra()}
    return {"name": name, "backend": "transformers" if builtin else "plugin", "weights": weights, "needs": "-"}


def _stored_fingerprints(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The fingerprints the store holds packages under (none when there is no store yet: it is not created)."""
    store = Path(args.store) if args.store else default_store_dir()
    if not args.catalog and not (store / "refsight.db").is_file():
        return []
    with open_engine(args) as engine:
        return engine.prune(dry_run=True).fingerprints


def cmd_models(args: argparse.Namespace) -> int:
    """refsight models"""
    from ..backends.registry import available_models  # the registry: names only, no backend is imported

    names = available_models()
    details = {name: {**describe_model(name), "fingerprints": []} for name in names}
    for fingerprint in _stored_fingerprints(args):
        owner = model_name(fingerprint, names)
        entry = details.setdefault(owner, {**describe_model(owner), "fingerprints": []})
        entry["fingerprints"].append({k: fingerprint[k] for k in ("fingerprint_digest", "packages", "bytes")})
    from ..backends.family_table import family_rows

    data = {"models": names, "default": default_model(), "details": list(details.values()), "families": family_rows()}
    emit(args, data, _models_table)
    return 0


def _models_table(d: dict[str, Any]) -> str:
    rows = [
        (
            m["name"] + (" (default)" if m["name"] == d["default"] else ""), m["backend"], m["weights"], m["needs"],
            ", ".join(f"{f['packages']} ({size(f['bytes'])})" for f in m["fingerprints"]) or "-",
        )
        for m in d["details"]
    ]
    note = ("\nRandom-weight models write meaningless text; their timings and caching are real. "
            "`refsight models --json` gives each stored fingerprint's digest.")
    return table(("model", "backend", "weights", "needs", "packages stored"), rows) + note + "\n\n" + _families_table(d)


def _families_table(d: dict[str, Any]) -> str:
    """Model type × runtime: the built-in that proves cached == fresh there, or why it is not served."""
    from ..backends.family_table import RUNTIMES

    def cell(entry: dict[str, Any]) -> str:
        return f"yes ({entry['model']})" if entry["proven"] else ("no" if entry["why"] == "not proven yet" else "not served")

    rows = [(row["model_type"], *(cell(row[r]) for r in RUNTIMES)) for row in d["families"]]
    return ("Model families (cached == fresh proven by a test in CI; `--json` gives each test and each reason):\n"
            + table(("model type", *RUNTIMES), rows))


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--report", default=None, metavar="HTML", type=path_argument, help="also write an HTML report here")


def cmd_demo(args: argparse.Namespace) -> int:
    """refsight demo"""
    from ..demo import run_demo

    return run_demo(store=args.store, model=args.model, as_json=args.json, report=args.report)


def _samples_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("directory", metavar="DIR", type=path_argument, help="where to write them (created if missing)")


def cmd_samples(args: argparse.Namespace) -> int:
    """refsight samples DIR"""
    from ..demo import write_samples

    written = write_samples(args.directory)
    emit(args, {"directory": str(args.directory), "files": [p.name for p in written]},
         lambda d: f"wrote {len(d['files'])} files to {d['directory']}: {', '.join(d['files'])}")
    return 0


COMMANDS = (
    Command("demo", "ingest bundled photos, compare a cat photo against them re-encoded, cached, then with another "
            "rubric; say how many encodes the cache avoided and what each cost", cmd_demo,
            _demo_arguments, model=True),
    Command("models", "list the registered models", cmd_models),
    Command("samples", "write the bundled photos, a new cat photo (new.jpg) and an example rubric (rubric.yaml) "
            "to DIR: the files the README's examples use", cmd_samples, _samples_arguments),
)
