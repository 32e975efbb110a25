"""What the new-process equivalence tests share (HF, llama.cpp, vLLM): the layout, the spec, the worker.

The parent side: :func:`layout` (two prompts, references in different places relative to
text and the candidate), :func:`stored_keys` (references encoded here, stored for the
worker), :func:`cases` (the rows of each layout as JSON segments) and :func:`run_worker`
(the spec written, the worker run in a NEW process), then :func:`assert_rows_match` and
:func:`assert_only_candidates_reached_vision` (what the HF tests hold the worker's rows to). The worker side: :func:`open_spec`
(the spec read, the parent's thread count, the store opened) and :func:`case_requests`.

A case's ``rows`` are lists of segments: ``{"text": ...}``, ``{"ref": package key}`` (read
from the store's disk tier: the worker's memory tier starts empty) or ``{"image": path}``
(a fresh candidate). Imported by the workers, which run as scripts: the llama.cpp and vLLM
ones put this directory on ``sys.path`` first.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

REFS = ("chelsea", "coffee", "astronaut")
CANDIDATE = "rocket"


def layout(n_refs: int) -> list[list[tuple]]:
    """Two prompts of different lengths (so left padding is exercised), references in different places."""
    refs = [("ref", i) for i in range(n_refs)]
    return [
        [*refs, ("text", "Compare the candidate"), ("cand",), ("text", " with the references. Same colour?")],
        [("text", "Describe"), *refs, ("text", " and"), ("cand",)],
    ]


def stored_keys(store: Any, packages: list[Any]) -> list[str]:
    """Put ``packages`` into ``store``; their keys, in order."""
    for package in packages:
        store.packages.put(package)
    return [p.key for p in packages]


def cases(prefix: str, keys: list[str], candidate: Path, max_new_tokens: int, **fields: Any) -> list[dict[str, Any]]:
    """One case per reference count (1 and 3), ids ``{prefix}{n}``, rows of :func:`layout` as JSON segments."""
    def segment(s: tuple) -> dict[str, Any]:
        return {"text": s[1]} if s[0] == "text" else {"ref": keys[s[1]]} if s[0] == "ref" else {"image": str(candidate)}

    return [
        {"id": f"{prefix}{n}", "rows": [[segment(s) for s in row] for row in layout(n)], "max_new_tokens": max_new_tokens, **fields}
        for n in (1, 3)
    ]


def run_worker(worker: Path, tmp: Path, spec: dict[str, Any], out_name: str) -> Path:
    """Write ``spec`` (plus its ``out`` path) beside ``tmp``, run ``worker`` on it in a new process; the output file."""
    out = tmp / out_name
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps({**spec, "out": str(out)}))
    proc = subprocess.run([sys.executable, str(worker), str(spec_path)], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def run_cached_path(worker: Path, tmp: Path, photos: dict[str, Any], backends: dict[str, Any], max_new_tokens: int,
                    **spec: Any) -> Any:
    """For each model in ``backends``: encode and store the references, then run ``worker`` over
    their cases (ids ``{model}/{n}``) in a new process; what it ``torch.save``-d."""
    import torch

    from refsight.store import open_store

    candidate = tmp / "candidate.png"
    photos[CANDIDATE].image.save(candidate)
    all_cases = []
    with open_store(tmp / "store") as store:
        for name, backend in backends.items():
            keys = stored_keys(store, backend.encode([photos[r] for r in REFS]))
            all_cases += cases(f"{name}/", keys, candidate, max_new_tokens, model=name)
    out = run_worker(worker, tmp, {"store": str(tmp / "store"), "cases": all_cases, **spec}, "cached.pt")
    results = torch.load(out, weights_only=False)
    results["codec"] = codec_use(tmp / "store")
    return results


def codec_use(root: Path) -> dict[str, int]:
    """How the store's codec kept the package files under ``root``: how many files, how many compressed, and how
    many of their tensors' frames are zstd-compressed byte planes (the header is frame 0)."""
    from refsight.vllm_connector import refsight_codec

    files = [memoryview(path.read_bytes()) for path in (root / "packages").rglob("*.safetensors")]
    tables = [refsight_codec.frames(data) for data in files]
    return {
        "files": len(files),
        "compressed": sum(bool(table) for table in tables),
        # Every frame, the header's included: a tiny model's random features may not shrink by the codec's 10%,
        # so their tensor frames can stay raw (zstd frames of every dtype: tests/store/test_store_codec.py).
        "zstd_frames": sum(method == "zstd" for table in tables for method, *_ in table),
    }


def assert_rows_match(rows: list[dict[str, Any]], fresh: list[tuple], bound: float = 0.0) -> None:
    """The worker's rows of one layout against the runtime's own pixel path, ``(tokens, logits)`` per row: the same
    greedy tokens, logits of the same shape within ``bound`` (max |Δ|), random-weight output labelled so."""
    assert len(rows) == len(fresh) == 2
    for row, (tokens, logits) in zip(rows, fresh):
        assert row["tokens"] == tokens
        assert row["logits"].shape == logits.shape
        assert (row["logits"] - logits).abs().max().item() <= bound
        assert row["random_weights"] is True


def assert_only_candidates_reached_vision(results: dict[str, Any], name: str, towers: int) -> None:
    """With one and three stored references, only the two fresh candidates (one per prompt) reached the processor,
    and the vision tower ``towers`` times; the stored references never did."""
    for n in (1, 3):
        assert results[f"{name}/{n}"]["counts"] == {"vision": towers, "preprocess": 2}


@contextlib.contextmanager
def open_spec(spec_path: str) -> Iterator[tuple[dict[str, Any], Any]]:
    """(spec, open store) for a worker; the parent's thread count first, when it sent one.

    CPU GEMMs split their reductions by thread, so the same count is what makes the two
    processes' float sums bit-identical.
    """
    from refsight.store import open_store

    with open(spec_path) as f:
        spec = json.load(f)
    if "threads" in spec:
        import torch

        torch.set_num_threads(spec["threads"])
    with open_store(spec["store"]) as store:
        yield spec, store


def case_requests(store: Any, case: dict[str, Any]) -> list[Any]:
    """The case's :class:`GenerationRequest` list; a package missing from ``store`` ends the worker, naming it."""
    from refsight.requests import GenerationRequest
    from refsight.inputs.images import load_image

    requests = []
    for row in case["rows"]:
        segments: list[Any] = []
        for segment in row:
            if "text" in segment:
                segments.append(segment["text"])
            elif "ref" in segment:
                package = store.packages.get(segment["ref"])
                if package is None:
                    raise SystemExit(f"package {segment['ref']} missing from the store")
                segments.append(package)
            else:
                segments.append(load_image(segment["image"]))
        requests.append(GenerationRequest(segments, max_new_tokens=case["max_new_tokens"]))
    return requests
