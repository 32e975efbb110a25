"""The family table: which model types run on which runtime, and the test that proves each.

A cell is proven when a test in CI shows the cached path equal to the runtime's own pixel
path for that model type (tokens and logits, one and two images) through a built-in tiny
checkpoint. The cells are read off the family entries (:data:`refsight.families.FAMILIES`);
``refsight models`` prints this table and the README carries it; the architecture test checks
that every test named here exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..families import FAMILIES
from ..families.entry import RUNTIMES

__all__ = ["Proof", "PROOFS", "RUNTIMES", "proven_model_types", "family_rows", "NOT_SERVED", "markdown_table"]


@dataclass(frozen=True)
class Proof:
    """One proven cell: the model type, the runtime, the built-in model and the test."""

    model_type: str
    runtime: str
    model: str
    test: str


#: Every proven cell of the family entries.
PROOFS: tuple[Proof, ...] = tuple(
    Proof(f.model_type, runtime, cell.builtin, cell.test)
    for f in FAMILIES.values() for runtime in RUNTIMES if (cell := f.on(runtime)).proven
)

#: Model types that cannot be served on a runtime here, with the reason (shown in the table).
NOT_SERVED: dict[tuple[str, str], str] = {
    (f.model_type, runtime): cell.left_out
    for f in FAMILIES.values() for runtime in RUNTIMES if (cell := f.on(runtime)).left_out
}


def proven_model_types(runtime: str) -> list[str]:
    """The model types proven on ``runtime``, sorted."""
    return sorted({p.model_type for p in PROOFS if p.runtime == runtime})


def family_rows() -> list[dict[str, object]]:
    """One row per model type: for each runtime the proving built-in and test, or why it is not served."""
    types = sorted({p.model_type for p in PROOFS} | {t for t, _ in NOT_SERVED})
    rows = []
    for model_type in types:
        row: dict[str, object] = {"model_type": model_type}
        for runtime in RUNTIMES:
            proof = next((p for p in PROOFS if p.model_type == model_type and p.runtime == runtime), None)
            if proof is not None:
                row[runtime] = {"proven": True, "model": proof.model, "test": proof.test}
            else:
                row[runtime] = {"proven": False, "why": NOT_SERVED.get((model_type, runtime), "not proven yet")}
        rows.append(row)
    return rows


def markdown_table() -> str:
    """The table as the README carries it: ✅ and the built-in where proven, ✖ where not served, – where not yet proven."""
    def cell(entry: dict[str, object]) -> str:
        if entry["proven"]:
            return f"✅ `{entry['model']}`"
        return "– " if entry["why"] == "not proven yet" else f"✖ {entry['why']}"

    lines = ["| model type | " + " | ".join(RUNTIMES) + " |", "|---|" + "---|" * len(RUNTIMES)]
    for row in family_rows():
        lines.append(f"| `{row['model_type']}` | " + " | ".join(cell(row[r]).strip() for r in RUNTIMES) + " |")  # type: ignore[arg-type]
    return "\n".join(lines)
