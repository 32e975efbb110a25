"""The Open WebUI check's failures as Markdown: every request refsight refused (or answered unreadably),
grouped by refsight's error, each with the check that sent it and the body's fields that matter (the
messages and tool specs summarised: the fixtures hold them whole); then the checks that failed without a
refusal. Written by ``benchmarks/open_webui.py --failures FILE``: the list the server's fixers work from.
"""

from __future__ import annotations

import json
import re

from open_webui_replay import unreadable

#: Body fields shown in summary only (their whole values are in the fixtures).
SUMMARISED = ("messages", "tools")
#: refsight's refusal of one field: ``400: num_ctx: this field is not supported by refsight``.
FIELD_ERROR = re.compile(r"(?P<status>\d{3}): (?P<field>[A-Za-z_][\w.]*): (?P<reason>.+)$", re.S)


def body_fields(body: object) -> str:
    """The body's fields, long ones summarised: what names the request's cause at a glance."""
    if not isinstance(body, dict):
        return json.dumps(body)
    shown = {key: value for key, value in body.items() if key not in SUMMARISED}
    if "tools" in body:
        names = [tool.get("function", {}).get("name") for tool in body["tools"] if isinstance(tool, dict)]
        shown["tools"] = f"<{len(names)} tools: {', '.join(map(str, names))}>"
    if "messages" in body:
        shown["messages"] = f"<{len(body['messages'])} messages>"
    return json.dumps(shown)


def cause_of(problem: str) -> tuple[str, str | None]:
    """``(cause, field)``: refsight's error with the field it names taken out, so one refusal of many fields
    (``num_ctx: this field is not supported``, ``num_gpu: ...``) is one cause."""
    named = FIELD_ERROR.match(problem)
    if not named:
        return problem, None
    return f"{named['status']}: FIELD: {named['reason']}", named["field"]


def refusals(records: list[dict]) -> dict[str, list[tuple[dict, str | None]]]:
    """``{cause: [(record, field), ...]}`` for every request not answered readably."""
    causes: dict[str, list[tuple[dict, str | None]]] = {}
    for record in records:
        problem = unreadable(record, record["response"])
        if problem:
            cause, field = cause_of(problem)
            causes.setdefault(cause, []).append((record, field))
    return causes


def failures_markdown(figures: dict, records: list[dict]) -> str:
    """The whole report (see the module docstring)."""
    causes = refusals(records)
    failed = {name: outcome for name, outcome in figures["checks"].items() if outcome != "passed"}
    lines = [
        f"# Open WebUI {figures.get('open_webui') or '(replay)'} against refsight serve {figures['model']}: failures",
        "",
        f"{len(failed)} of {len(figures['checks'])} checks failed; refsight refused or answered unreadably "
        f"{sum(map(len, causes.values()))} of {len(records)} requests, from {len(causes)} causes.",
        "",
    ]
    for number, (cause, group) in enumerate(sorted(causes.items(), key=lambda item: -len(item[1])), 1):
        fields = sorted({field for _, field in group if field})
        named = f"; FIELD: {', '.join(fields)}" if fields else ""
        lines += [f"## {number}. `{cause}` ({len(group)} requests{named})", ""]
        for record, field in group:
            task = f" ({record['task']} task)" if record.get("task") else ""
            lines.append(f"- `{record['label']}`{task}{f' ({field})' if field else ''}: "
                         f"`{record['method']} {record['path']}` `{body_fields(record['body'])}`")
        lines.append("")
    others = {name: outcome for name, outcome in failed.items() if "refsight answered" not in outcome}
    if others:
        lines += ["## Checks that failed without a refusal", ""]
        lines += [f"- `{name}`: {outcome}" for name, outcome in others.items()]
        lines.append("")
    return "\n".join(lines)
