"""How comparisons are shown to people: a text table and a self-contained HTML page.

* :func:`format_comparison` – the readable table ``refsight compare`` and ``refsight demo`` print.
* :func:`write_comparison_report` – thumbnails beside coloured verdicts; ``refsight demo
  --report out.html`` writes one, with the images inlined so the file can be mailed or archived.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any, Mapping

from .terminal import escape_controls

__all__ = ["format_comparison", "write_comparison_report", "render_comparison_report"]

def format_comparison(data: dict[str, Any]) -> str:
    """A readable table per reference for ``refsight compare`` without ``--json``."""
    lines = []
    if data["random_weights"]:
        lines.append(f"!! {data['model']} has RANDOM weights: VLM verdicts below are meaningless !!")
    if data.get("recalled"):
        lines.append("recalled: " + ", ".join(f"{r['ref_id']} ({r['score']:.3f})" for r in data["recalled"]))
    for rank, result in enumerate(data["results"], 1):
        scores = "".join(
            f"  {name} {result[key]:.3f}" for name, key in (("rerank", "rerank_score"), ("recall", "recall_score"))
            if result.get(key) is not None
        )
        if result.get("stage", "judged") != "judged":
            # Not judged: the ranking line says how far it got (and why, when filtered).
            why = result.get("filtered_by") and f"  filtered by: {escape_controls('; '.join(result['filtered_by']))}"
            lines.append(f"\n#{rank} {result['ref_id']}  {result['stage']}{scores}{why or ''}")
            continue
        cached = "from cache" if result["reference_cached"] else "encoded now"
        lines.append(f"\n#{rank} {result['ref_id']}  score {result['score']:.2f}{scores}  ({cached})")
        # Criteria and evidence are user and model text: one line each, controls escaped.
        shown = [(escape_controls(c["criterion"]), escape_controls(str(c["evidence"]))) for c in result["criteria"]]
        width = max([len(text) for text, _ in shown] + [9])
        for c, (text, evidence) in zip(result["criteria"], shown):
            lines.append(
                f"  {text:<{width}}  {c['verdict']:<9} {c['confidence']:.2f}  "
                f"[{c['source']}]  {evidence}"
            )
    timings = ", ".join(f"{k} {v:.0f} ms" for k, v in data["timings_ms"].items())
    lines.append(f"\ntimings: {timings}")
    return "\n".join(lines)


_COLOURS = {"match": "#1b7f3b", "mismatch": "#b3261e", "uncertain": "#8a6d00"}


def _thumbnail(path: Path, size: int = 160) -> str:
    from PIL import Image

    with Image.open(path) as image:
        image = image.convert("RGB")
        image.thumbnail((size, size))
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def render_comparison_report(result: Mapping[str, Any], *, candidate: Path, references: Mapping[str, Path]) -> str:
    """The HTML text for ``result`` (the JSON of ``refsight compare``)."""
    e = html.escape
    rows = []
    for item in result["results"]:
        if item.get("stage", "judged") != "judged":
            continue  # the report shows the judged references; the ranking of the rest is in the JSON
        cells = "".join(
            f'<tr><td>{e(c["criterion"])}</td><td style="color:{_COLOURS.get(c["verdict"], "#333")};font-weight:600">'
            f"{e(c['verdict'])}</td><td>{c['confidence']:.2f}</td><td>{e(c['source'])}</td><td>{e(c['evidence'])}</td></tr>"
            for c in item["criteria"]
        )
        image = references.get(item["ref_id"])
        thumb = f'<img src="{_thumbnail(image)}" alt="{e(item["ref_id"])}">' if image else ""
        cached = "from cache" if item["reference_cached"] else "encoded now"
        rows.append(
            f'<section><div class="ref">{thumb}<div><b>{e(item["ref_id"])}</b><br>score {item["score"]:.2f}'
            f"<br><small>{cached}</small></div></div><table><tr><th>criterion</th><th>verdict</th>"
            f"<th>conf.</th><th>source</th><th>evidence</th></tr>{cells}</table></section>"
        )
    warning = (
        f'<p class="warn">{e(result["model"])} has RANDOM weights: the VLM verdicts are meaningless; '
        "attribute verdicts and timings are real.</p>"
        if result.get("random_weights")
        else ""
    )
    timings = ", ".join(f"{e(k)} {v:.0f} ms" for k, v in result["timings_ms"].items())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>refsight comparison</title><style>
body{{font-family:system-ui,sans-serif;margin:2em;color:#222}} img{{border-radius:6px;margin-right:1em}}
section{{border-top:1px solid #ddd;padding:1em 0}} .ref{{display:flex;align-items:center;margin-bottom:.5em}}
table{{border-collapse:collapse}} td,th{{padding:.2em .8em;text-align:left;border-bottom:1px solid #eee}}
.warn{{background:#fff3cd;padding:.6em;border-radius:6px}}</style></head><body>
<h1>refsight comparison</h1>{warning}
<div class="ref"><img src="{_thumbnail(candidate)}" alt="candidate"><div><b>candidate</b><br>
<small>{e(result["candidate_sha256"][:16])}</small><br>model {e(result["model"])}</div></div>
{"".join(rows)}<p><small>timings: {timings}</small></p></body></html>"""


def write_comparison_report(
    path: str | Path, result: Mapping[str, Any], *, candidate: Path, references: Mapping[str, Path]
) -> Path:
    """Write the report to ``path`` and return it."""
    path = Path(path)
    path.write_text(render_comparison_report(result, candidate=candidate, references=references), encoding="utf-8")
    return path
