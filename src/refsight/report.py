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

from .inputs.terminal import escape_controls

__all__ = ["format_comparison", "format_timings", "format_ms", "write_comparison_report", "render_comparison_report"]

def format_comparison(data: dict[str, Any]) -> str:
    """A readable table per reference for ``refsight compare`` without ``--json``.

    An ``uncertain`` verdict shows no confidence (it is no claim to be confident in), and the
    evidence a random-weight model wrote is shown as ``(random text)``: it is noise, often
    not even words.
    """
    lines = []
    random = bool(data["random_weights"])
    if random:
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
        lines.extend(_criteria_lines(result["criteria"], random=random))
    lines.append(f"\ntimings: {format_timings(data['timings_ms'])}")
    return "\n".join(lines)


def _criteria_lines(criteria: list[dict[str, Any]], *, random: bool) -> list[str]:
    """One line per criterion: text, verdict, confidence (not for ``uncertain``), source, evidence."""
    # Criteria and evidence are user and model text: one line each, controls escaped.
    shown = [escape_controls(c["criterion"]) for c in criteria]
    width = max([len(text) for text in shown] + [9])
    lines = [f"  {'criterion':<{width}}  {'verdict':<9} {'conf':>4}  {'source':<12}  evidence"]
    for c, text in zip(criteria, shown):
        confidence = "" if c["verdict"] == "uncertain" else f"{c['confidence']:.2f}"
        evidence = "(random text)" if random and c["source"] == "vlm" else escape_controls(str(c["evidence"]))
        lines.append(f"  {text:<{width}}  {c['verdict']:<9} {confidence:>4}  {'[' + c['source'] + ']':<12}  {evidence}")
    return lines


def format_timings(timings_ms: Mapping[str, float]) -> str:
    """``recall 2.4 s, judge 812 ms, ...``: each stage's time in a unit a person reads at a glance."""
    return ", ".join(f"{name.replace('_', ' ')} {format_ms(ms)}" for name, ms in timings_ms.items())


def format_ms(ms: float) -> str:
    """Milliseconds for people: ``0.42 ms``, ``48 ms``, ``2.4 s``, ``1 min 12 s``."""
    if ms < 10:
        return f"{ms:.2f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{int(ms // 60_000)} min {ms % 60_000 / 1000:.0f} s"


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
        random = bool(result.get("random_weights"))
        cells = "".join(
            f'<tr><td>{e(c["criterion"])}</td><td style="color:{_COLOURS.get(c["verdict"], "#333")};font-weight:600">'
            f"{e(c['verdict'])}</td><td>{'' if c['verdict'] == 'uncertain' else format(c['confidence'], '.2f')}</td>"
            f"<td>{e(c['source'])}</td><td>{'(random text)' if random and c['source'] == 'vlm' else e(c['evidence'])}</td></tr>"
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
    timings = e(format_timings(result["timings_ms"]))
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
