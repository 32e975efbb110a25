"""The rows of a compare's result, one per reference of the shortlist, and their order."""

from __future__ import annotations

from typing import Any

from ..judge.prefilter import Filtered

__all__ = ["REACHED", "other_row", "sort_results"]

#: The stage a result reached, furthest last (``filtered`` is reported, never silent).
REACHED = ("filtered", "recalled", "reranked", "judged")
_ORDER = {"judged": 0, "reranked": 1, "recalled": 2, "filtered": 3}


def other_row(ref_id: str, stage: str, filtered: Filtered | None) -> dict[str, Any]:
    """The row of a reference that was not judged: filtered (with why), or only recalled or reranked."""
    if filtered is not None:
        return {
            "ref_id": ref_id, "score": 0.0, "criteria": [v.to_dict() for v in filtered.verdicts],
            "stage": "filtered", "filtered_by": filtered.criteria,
        }
    return {"ref_id": ref_id, "score": None, "criteria": [], "stage": stage}


def sort_results(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Judged by score (ties: rerank score, then recall score), then reranked-only, recalled-only, filtered."""

    def key(row: dict[str, Any]) -> tuple:
        def neg(name: str) -> float:
            value = row.get(name)
            return -value if value is not None else float("inf")

        return (_ORDER[row["stage"]], neg("score"), neg("rerank_score"), neg("recall_score"))

    return sorted(rows, key=key)  # stable: equal keys keep the shortlist's order
