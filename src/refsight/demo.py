"""``refsight demo``: the whole product on bundled real photos, in under three minutes.

1. Ingest the seven bundled real photos as references (each encoded once, with a progress bar).
2. Recall by text with the real offline embedder ("a tabby cat").
3. Judge a new candidate (a flipped crop of the cat photo) against every reference
   with a cat rubric, first the way stacks do it today (every reference re-encoded),
   then from the cache (same verdicts, no reference encoder run), then with another rubric
   over the same references (their KV prefix reused); the figures come from the store's
   counters: encodes avoided, what each cost against loading its package, prefix tokens reused.

It uses a real VLM when one is available locally, and otherwise says plainly that it
falls back to an offline random-weight model whose verdict text is meaningless; the
timings, the cache and the ImageNet attribute records (real weights) are real either way, and
with random weights the ranking shown comes from those real parts.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .report import format_ms

__all__ = ["run_demo", "write_samples", "cache_figures", "real_ranking", "SAMPLE_RUBRIC", "DEMO_RUBRIC", "REAL_DEMO_MODEL", "FALLBACK_DEMO_MODEL",
           "DEMO_OPTIONS", "demo_engine", "browse_hint"]

#: The real model the demo prefers, when its weights are already on this machine.
REAL_DEMO_MODEL = "hf:HuggingFaceTB/SmolVLM-256M-Instruct"
#: The offline random-weight model used otherwise: SmolVLM-256M's real-size vision tower (random
#: weights), so encoding costs what it costs with the real model and the cache's win shows in the
#: wall times; its language model is one layer and its vocabulary 4096 tokens (a verdict is a few dozen decode
#: steps, not ~220 byte-sized ones: :mod:`refsight.builtin_models.shape_vocab`), so the demo stays quick on a laptop's CPU.
FALLBACK_DEMO_MODEL = "shape-smolvlm-256m"
#: One 512×512 tile per image (SmolVLM-256M's tile size): a few seconds an encode on 2 CPU cores, where the
#: model's default tiling (up to 4×4 tiles and a global one) costs ~10× that and 13× the image tokens
#: (docs/benchmarks.md#image-cost).
FALLBACK_MAX_PIXELS = 512 * 512
#: The options the demo encodes with, per model: written into the demo's store (its ``refsight.toml``), so the
#: ``refsight serve --store …`` line it prints, and every other command on that store, encodes the same way and
#: finds the demo's packages cached.
DEMO_OPTIONS: dict[str, dict[str, Any]] = {FALLBACK_DEMO_MODEL: {"max_pixels": FALLBACK_MAX_PIXELS}}
DEMO_RUBRIC = "- is a cat\n- short fur\n- triangular ears\n- dark forehead stripes"
#: Short evidence keeps a random-weight model (which always writes to the bound) quick.
DEMO_EVIDENCE_CHARS = 16


def _real_model_available(name: str) -> bool:
    """True when the hub model's files are in the local cache (never touches the network)."""
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(name.removeprefix("hf:"), local_files_only=True)
        return True
    except Exception:
        return False


def _candidate(path: Path, into: Path, name: str = "candidate-cat.png") -> Path:
    """A new photo of the same cat: mirrored and cropped, so its pixels are new."""
    from PIL import Image, ImageOps

    with Image.open(path) as image:
        mirrored = ImageOps.mirror(image.convert("RGB"))
    w, h = mirrored.size
    crop = mirrored.crop((int(w * 0.08), int(h * 0.05), int(w * 0.95), h))
    out = into / name
    crop.save(out, **({"quality": 95} if out.suffix == ".jpg" else {}))
    return out


#: The example rubric ``refsight samples`` writes (the README's ``--criteria @rubric.yaml``); it opens with
#: ``---`` so that it reads as YAML (see ``refsight.inputs.rubric``), its comments after.
SAMPLE_RUBRIC = """\
---
# An example rubric: one criterion per entry. weight (default 1) counts in the score;
# required: a mismatch makes the score 0, and a reference whose stored attribute records
# settle it as a mismatch is dropped before any VLM work.
criteria:
  - text: is a cat
    required: true
  - text: short fur
  - text: triangular ears
    weight: 2
"""


def write_samples(directory: str | Path) -> list[Path]:
    """``refsight samples DIR``: the bundled photos (under their names: ``chelsea.jpg`` ...), ``new.jpg``
    (a new photo of the cat: mirrored and cropped) and ``rubric.yaml``, the files the README's
    examples use. Files already there are replaced; returns the paths written."""
    from .samples import sample_paths

    into = Path(directory)
    into.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sample_paths().values():
        target = into / path.name
        shutil.copyfile(path, target)
        written.append(target)
    written.append(_candidate(sample_paths()["chelsea"], into, "new.jpg"))
    rubric = into / "rubric.yaml"
    rubric.write_text(SAMPLE_RUBRIC, encoding="utf-8")
    written.append(rubric)
    return written


def _strip(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The verdicts of a comparison without its timings and cache flags."""
    return [{k: v for k, v in r.items() if k != "reference_cached"} for r in result["results"]]


def browse_hint(store: str | None, model: str) -> str:
    """The command line that serves the demo's references, and where to open them."""
    from .support.environment import default_model

    flags = "" if store is None else f" --store {shlex.quote(store)}"
    flags += "" if model == default_model() else f" --model {shlex.quote(model)}"
    return f"refsight serve{flags}, then open http://127.0.0.1:8000/"


def _server_hint() -> str:
    """Nothing when the server extra is installed; else the line that installs it, from where refsight came."""
    import importlib.util

    from .support.extras import install_command

    def installed(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken or half-removed package counts as missing
            return False

    if all(installed(m) for m in ("fastapi", "uvicorn", "multipart", "prometheus_client")):
        return ""
    return f" (it needs the server extra: {install_command('server')})"


#: The rubric of the demo's third comparison: another question over the same references, so the
#: references' KV prefix (built by the second comparison) is reused.
DEMO_SECOND_RUBRIC = "- short fur"
#: References the VLM judges (the best by recall); every reference is recalled and ranked.
DEMO_JUDGED = 3


def run_demo(
    *, store: str | None = None, model: str | None = None, as_json: bool = False, report: str | None = None
) -> int:
    """Run the demo; returns the exit code (0 when the cached verdicts equal the fresh ones).

    The references go to ``store`` (default: the demo's own store, apart from the one the other
    commands use, so its photos never mix with the user's references); they stay there to be
    browsed, and a second run finds them all cached.
    """
    from .support.environment import demo_store_dir
    from .samples import sample_paths

    say = (lambda *a: None) if as_json else (lambda *a: print(*a, flush=True))
    started = time.perf_counter()
    model = _choose_model(model, say)
    store_dir = Path(store) if store else demo_store_dir()
    say(f"The demo keeps its references in a store of its own: {store_dir} (later runs find them cached).")
    if model in DEMO_OPTIONS:
        said = ", ".join(f"{name} = {value}" for name, value in DEMO_OPTIONS[model].items())
        say(f"It encodes with {said}, kept in the store's refsight.toml: every command "
            "on this store encodes the same way and finds these references cached.")
    say("")
    scratch = Path(tempfile.mkdtemp(prefix="refsight-demo-"))  # only the candidate photo is scratch
    try:
        photos = sample_paths()
        # Bars only on a terminal: piped or logged output gets the figures, not carriage returns.
        with demo_engine(store_dir, model, progress=not as_json and sys.stderr.isatty()) as engine:
            added = _add_photos(engine, photos, model, say)
            found = _search(engine, say)
            candidate = _candidate(photos["chelsea"], scratch)
            ref_ids = [row["ref_id"] for row in added if "error" not in row]
            runs = _compare_three_ways(engine, candidate, ref_ids, say)
        figures = cache_figures(runs["before"], runs["after"])
        summary = _summary(runs, figures, found, ref_ids, str(store_dir), store_dir, started)
        _say_results(runs, summary, say)
        if report:
            from .report import write_comparison_report

            write_comparison_report(report, runs["cached"], candidate=candidate, references=photos_by_id(added, photos))
            say(f"HTML report: {report}")
        say(f"Done in {summary['seconds']} s.")
        say(f"Browse the references and chat with them: {summary['browse']}{_server_hint()}")
        if as_json:
            print(json.dumps(summary), flush=True)
        return 0 if summary["verdicts_identical"] and summary["all_references_cached"] else 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def demo_engine(store_dir: Path, model: str, *, progress: bool = False) -> Any:
    """The demo's engine on ``store_dir``: the model's demo options (:data:`DEMO_OPTIONS`) written into the
    store's ``refsight.toml`` first, and read from there, as every later command on the store reads them."""
    from . import Engine
    from .settings import BackendOptions, remember_model_options

    if model in DEMO_OPTIONS:
        remember_model_options(store_dir, model, BackendOptions(**DEMO_OPTIONS[model]))
    return Engine(store_dir, model=model, progress=progress)


def _choose_model(model: str | None, say: Callable[..., None]) -> str:
    """The model asked for, else the real one when its weights are here, else the offline random one (said so)."""
    if model is not None:
        return model
    if _real_model_available(REAL_DEMO_MODEL):
        return REAL_DEMO_MODEL
    say(
        f"No real VLM weights on this machine ({REAL_DEMO_MODEL.removeprefix('hf:')} is not in the local "
        f"Hugging Face cache), so this demo falls back to {FALLBACK_DEMO_MODEL}, an offline model with "
        "RANDOM weights: its verdict text is meaningless, so the ranking below comes from the parts with real "
        "weights (recall by EfficientNet-Lite0 + MiniLM embeddings, criteria the ImageNet records settle). "
        "Timings and caching are real.\n"
    )
    return FALLBACK_DEMO_MODEL


def _add_photos(engine: Any, photos: dict[str, Path], model: str, say: Callable[..., None]) -> list[dict[str, Any]]:
    """Step 1: the bundled photos as references, each encoded once (a table of what each cost)."""
    say(f"1. Adding {len(photos)} bundled photos as references with {model} ...")
    added = [r.to_dict() for r in engine.add_many(list(photos.values()))]
    say(f"   {'reference':<14} {'package':<22} size")
    for row in added:
        if "error" in row:
            say(f"   {row['input']}: {row['error']}")
        else:
            state = "cached (no encode)" if row["cached"] else f"encoded in {format_ms(row['encode_ms'])}"
            say(f"   {row['ref_id']:<14} {state:<22} {row['bytes'] / 1024:.0f} KiB")
    return added


def _search(engine: Any, say: Callable[..., None]) -> dict[str, Any]:
    """Step 2: recall by text with the real offline embedder."""
    say('\n2. Text search "a tabby cat" (real offline embedder, no VLM):')
    found = engine.search("a tabby cat", k=3).to_dict()
    for hit in found["results"]:
        say(f"   {hit['score']:.3f}  {hit['ref_id']}")
    return found


def _compare_three_ways(engine: Any, candidate: Path, ref_ids: list[str], say: Callable[..., None]) -> dict[str, Any]:
    """Step 3: the fresh path, the cached path (the store's counters read around it), another rubric."""
    say(f"\n3. Comparing a new photo (mirrored crop of the cat) with all {len(ref_ids)} references "
        f"(all recalled and ranked, the best {min(DEMO_JUDGED, len(ref_ids))} judged by the VLM).")
    shape = {
        "ref_ids": ref_ids, "top_k": min(DEMO_JUDGED, len(ref_ids)), "recall_k": len(ref_ids),
        "evidence_max_chars": DEMO_EVIDENCE_CHARS,
    }
    # A first comparison in a process pays one-off start-up costs (lazy imports, first-call allocations):
    # made here, untimed, on another rubric, so the three timed runs below compare like with like.
    engine.compare(candidate, criteria=DEMO_SECOND_RUBRIC, use_cache=False, **{**shape, "top_k": 1})
    wall: dict[str, float] = {}

    def timed(label: str, **kwargs: Any) -> dict[str, Any]:
        began = time.perf_counter()
        result = engine.compare(candidate, **shape, **kwargs).to_dict()
        wall[label] = round(time.perf_counter() - began, 2)
        return result

    say("   a) the way stacks do it today: every reference re-encoded for the request ...")
    fresh = timed("re_encoded", criteria=DEMO_RUBRIC, use_cache=False)
    before = engine.stats().to_dict()
    say("   b) with refsight's cache: reference packages loaded, only the candidate encoded ...")
    cached = timed("cached", criteria=DEMO_RUBRIC)
    say(f'   c) another rubric ("{DEMO_SECOND_RUBRIC.lstrip("- ")}") over the same references: their KV prefix reused ...')
    timed("new_rubric", criteria=DEMO_SECOND_RUBRIC)
    after = engine.stats().to_dict()
    return {"fresh": fresh, "cached": cached, "before": before, "after": after, "wall_s": wall}


def cache_figures(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the cache did between two ``stats()`` readings, from the store's counters.

    Counts and sums only, never a difference of two wall-clock totals, so no figure can go
    negative: encodes avoided (hits), what each avoided encode had cost against what loading
    its package cost, and the prompt tokens served from stored prefix states.
    """
    def grew(name: str) -> float:
        return max(0.0, float(after.get(name) or 0) - float(before.get(name) or 0))

    avoided = int(grew("hits"))
    return {
        "encodes_avoided": avoided,
        "encode_ms_per_reference": round(grew("encode_ms_saved") / avoided, 3) if avoided else None,
        "load_ms_per_reference": round(grew("load_ms") / avoided, 3) if avoided else None,
        "encode_ms_saved": round(grew("encode_ms_saved"), 3),
        "prefix_states_reused": int(grew("prefix_hits")),
        "prefix_tokens_reused": int(grew("prefix_tokens_reused")),
        "prefill_ms_saved": round(grew("prefix_ms_saved"), 3),
    }


def real_ranking(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The references ranked by the stages with real weights: what the ImageNet records settle
    (fewest mismatches, then most matches), then the recall score of the real embeddings."""
    rows = []
    for item in result["results"]:
        settled = [(c["criterion"], c["verdict"]) for c in item.get("criteria", []) if c["source"] == "attributes"]
        rows.append({"ref_id": item["ref_id"], "recall_score": item.get("recall_score"), "settled": settled})

    def rank(row: dict[str, Any]) -> tuple[int, int, float]:
        verdicts = [verdict for _, verdict in row["settled"]]
        return verdicts.count("mismatch"), -verdicts.count("match"), -(row["recall_score"] or 0.0)

    return sorted(rows, key=rank)


def _summary(
    runs: dict[str, Any], figures: dict[str, Any], found: dict[str, Any], ref_ids: list[str], store: str | None,
    store_dir: Path, started: float,
) -> dict[str, Any]:
    """The demo's outcome as JSON (``refsight demo --json``)."""
    fresh, cached = runs["fresh"], runs["cached"]
    return {
        "model": cached["model"],
        "random_weights": cached["random_weights"],
        "references": len(ref_ids),
        "search_top": found["results"][0]["ref_id"] if found["results"] else None,
        "ranking": [row["ref_id"] for row in real_ranking(cached)] if cached["random_weights"]
        else [item["ref_id"] for item in cached["results"]],
        "cache": figures,
        "fresh_total_ms": fresh["timings_ms"]["total"],
        "cached_total_ms": cached["timings_ms"]["total"],
        "wall_s": runs["wall_s"],
        "speedup": {label: round(runs["wall_s"]["re_encoded"] / max(seconds, 1e-6), 2)
                    for label, seconds in runs["wall_s"].items() if label != "re_encoded"},
        "all_references_cached": all(r["reference_cached"] for r in cached["results"] if r["stage"] == "judged"),
        "verdicts_identical": _strip(fresh) == _strip(cached),
        "stats": runs["after"],
        "seconds": round(time.perf_counter() - started, 1),
        "store": str(store_dir),
        "browse": browse_hint(store, cached["model"]),
    }


def _say_results(runs: dict[str, Any], summary: dict[str, Any], say: Callable[..., None]) -> None:
    """The ranking a person can trust, the VLM's verdicts for what they are, then the cache's figures."""
    from .report import format_comparison

    cached = runs["cached"]
    if cached["random_weights"]:
        say("\nRanking from the stages with real weights (recall: real embeddings; criteria the ImageNet records settle):")
        say(f"   {'#':>2}  {'reference':<12} {'recall':>6}  settled by ImageNet")
        for rank, row in enumerate(real_ranking(cached), 1):
            settled = "; ".join(f"{text}: {verdict}" for text, verdict in row["settled"]) or "-"
            recall = "" if row["recall_score"] is None else f"{row['recall_score']:.3f}"
            say(f"   {rank:>2}  {row['ref_id']:<12} {recall:>6}  {settled}")
        say("\nThe VLM's own verdicts (RANDOM weights: noise, shown only to prove the cache changes nothing):")
    say("\n" + format_comparison(cached))
    say(_closing_lines(summary))


def _closing_lines(summary: dict[str, Any]) -> str:
    """The demo's last figures: encodes avoided and what each cost, prefix reuse, cached == fresh."""
    cache = summary["cache"]
    lines = ["", f"Cached == fresh: verdicts identical to the fresh path: {summary['verdicts_identical']}; "
                 f"every judged reference from the cache: {summary['all_references_cached']}."]
    if cache["encodes_avoided"]:
        lines.append(
            f"Encodes avoided: {cache['encodes_avoided']} (each avoided encode had cost "
            f"{format_ms(cache['encode_ms_per_reference'])} when it ran; loading its package instead took "
            f"{format_ms(cache['load_ms_per_reference'])}): {format_ms(cache['encode_ms_saved'])} of encoder time saved."
        )
    else:
        lines.append("Encodes avoided: 0 (no reference package was served from the cache).")
    lines.append(
        f"KV prefix reuse: {cache['prefix_states_reused']} reference prefix state(s) reused, "
        f"{cache['prefix_tokens_reused']} prompt tokens not prefilled again ({format_ms(cache['prefill_ms_saved'])} saved)."
    )
    wall, speedup = summary["wall_s"], summary["speedup"]
    lines += [
        "The same comparison, wall time:",
        f"   a) references re-encoded (today's stacks)    {wall['re_encoded']:>7.2f} s",
        f"   b) references from the package cache          {wall['cached']:>7.2f} s   {speedup['cached']:.1f}x faster",
        f"   c) another rubric, KV prefix reused           {wall['new_rubric']:>7.2f} s   {speedup['new_rubric']:.1f}x faster",
    ]
    return "\n".join(lines)


def photos_by_id(added: list[dict[str, Any]], photos: dict[str, Path]) -> dict[str, Path]:
    """Map each added reference id to its photo file."""
    # add_many answers in input order, so rows and photos pair up one to one.
    return {row["ref_id"]: path for row, path in zip(added, photos.values()) if "error" not in row}
