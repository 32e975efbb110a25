"""Running the new-process workers of the llama.cpp tests (a uniquely named module, like llama_models.py).

The families, quantized and Qwen3-VL tests replay packages and prefix states from a store on disk in
a NEW process (:func:`stored_proofs`) with the same workers as the equivalence and prefix-cache tests,
and hold them against llama.cpp's own pixel path (:func:`pixel_path_rows`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def run_worker(script: str, tmp: Path, cases: list[dict]) -> dict:
    """Run ``script`` (``_llamacpp_cached_worker.py`` or ``_llamacpp_prefix_worker.py``) on ``cases`` over
    the store at ``tmp/store``; its results by case id."""
    import torch

    out = tmp / f"{script}.pt"
    spec = tmp / f"{script}.json"
    spec.write_text(json.dumps({"store": str(tmp / "store"), "cases": cases, "out": str(out)}))
    proc = subprocess.run([sys.executable, str(HERE / script), str(spec)], capture_output=True, text=True,
                          timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


def spec_rows(rows: list[list[tuple]], keys: list[str], candidate: Path) -> list[list[dict]]:
    """The cached worker's rows of a ``layout``: text, reference keys by index, the candidate's path."""
    return [
        [{"text": s[1]} if s[0] == "text" else {"ref": keys[s[1]]} if s[0] == "ref" else {"image": str(candidate)}
         for s in row]
        for row in rows
    ]


def stored_proofs(
    gguf, photos, tmp: Path, models: tuple[str, ...], *, n_refs: tuple[int, ...], refs: tuple[str, ...],
    candidate: str, rubrics: tuple[str, ...], max_new_tokens: int,
) -> tuple[dict, dict, dict]:
    """Per model: its ``refs``' packages stored at ``tmp/store``, and the judge's runs here without the prefix cache
    and with it (``here[name]``: ``plain``, ``cached``); then one new process replays the packages beside the
    candidate, a case ``name/n`` for each count of references in ``n_refs`` (``cached``), and another the prefix
    states from disk (``prefix[name]``). Returns ``(here, cached, prefix)``."""
    from _llamacpp_prefix_worker import judge_request, run
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store
    from worker_spec import layout, stored_keys

    candidate_png = tmp / "candidate.png"
    photos[candidate].image.save(candidate_png)
    here, cached_cases, prefix_cases = {}, [], []
    with open_store(tmp / "store") as store:
        cache = PrefixStateCache(store)
        for name in models:
            backend = gguf(name)
            packages = backend.encode([photos[r] for r in refs])
            keys = stored_keys(store, packages)
            here[name] = {
                "plain": [run(backend, judge_request(packages, photos[candidate], r, None)) for r in rubrics],
                "cached": [run(backend, judge_request(packages, photos[candidate], r, cache)) for r in rubrics],
            }
            cached_cases += [
                {"id": f"{name}/{n}", "model": name, "rows": spec_rows(layout(n), keys, candidate_png),
                 "max_new_tokens": max_new_tokens}
                for n in n_refs
            ]
            prefix_cases.append({"id": name, "model": name, "refs": keys, "candidate": str(candidate_png),
                                 "rubrics": list(rubrics)})
    cached = run_worker("_llamacpp_cached_worker.py", tmp, cached_cases)
    return here, cached, run_worker("_llamacpp_prefix_worker.py", tmp, prefix_cases)


def pixel_path_rows(
    backend, prompt: str, photos, refs: tuple[str, ...], candidate: str, max_new_tokens: int
) -> list[tuple]:
    """llama.cpp's own pixel path (:class:`test_llamacpp_equivalence.PixelPath`) on the model files of
    ``backend``, for every row of ``layout(len(refs))`` in ``prompt`` (the family's, written from its chat template
    independently of refsight's prompt code): ``(tokens, logits)`` per row."""
    import llama_cpp.mtmd_cpp as M
    from test_llamacpp_equivalence import PixelPath
    from worker_spec import layout

    runner = PixelPath(backend.model_path, backend.mmproj_path, backend.runtime.settings.threads())
    marker = M.mtmd_default_marker().decode()
    try:
        out = []
        for row in layout(len(refs)):
            content = "".join(s[1] if s[0] == "text" else marker for s in row)
            images = [photos[refs[s[1]]] if s[0] == "ref" else photos[candidate] for s in row if s[0] != "text"]
            out.append(runner.run(prompt.format(content), images, max_new_tokens))
        return out
    finally:
        runner.close()
