"""Running the new-process workers of the llama.cpp tests (a uniquely named module, like llama_models.py).

The quantized and Qwen3-VL tests replay packages and prefix states from a store on disk in
a NEW process with the same workers as the equivalence and prefix-cache tests.
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


def pixel_path_rows(backend, photos, refs: tuple[str, ...], candidate: str, max_new_tokens: int) -> list[tuple]:
    """llama.cpp's own pixel path (:class:`test_llamacpp_equivalence.PixelPath`) on the model files of
    ``backend``, for every row of ``layout(len(refs))`` in the ChatML prompt: ``(tokens, logits)`` per row."""
    import llama_cpp.mtmd_cpp as M
    from llama_models import PROMPTS
    from test_llamacpp_equivalence import PixelPath, layout

    runner = PixelPath(backend.model_path, backend.mmproj_path, backend.runtime.settings.threads())
    marker = M.mtmd_default_marker().decode()
    try:
        out = []
        for row in layout(len(refs)):
            content = "".join(s[1] if s[0] == "text" else marker for s in row)
            images = [photos[refs[s[1]]] if s[0] == "ref" else photos[candidate] for s in row if s[0] != "text"]
            out.append(runner.run(PROMPTS["tiny-qwen2-vl-gguf"].format(content), images, max_new_tokens))
        return out
    finally:
        runner.close()
