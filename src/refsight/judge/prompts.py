"""Prompt layout for judging: references first, then the candidate, then criteria and instructions.

The order is deliberate. Everything up to and including the last reference depends
only on the references, never on the rubric or the candidate, so it is an identical
prefix across requests (a later issue reuses the language model's KV cache for it).
The criteria and the instructions come last because they change per request.

Only the order and the words are decided here: each backend wraps the segments in
its own chat template and image placeholders.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ..backends.base import Segment
from ..requests import GenerationRequest
from ..inputs.images import ImageInput
from ..package import VisualPackage
from ..cache.packages import ModelImage
from ..inputs.rubric import Criterion

__all__ = [
    "JUDGE_PREAMBLE",
    "reference_prefix",
    "criteria_block",
    "build_judge_request",
    "build_attribute_request",
    "YES_NO_SYSTEM",
    "QUERY_INSTRUCTION",
    "yes_no_segments",
]

#: Fixed opening text; part of the shared prefix.
JUDGE_PREAMBLE = "You compare a candidate image with reference images, one criterion at a time."

#: What a reranking model is told before every yes/no pair (the Qwen3-VL-Reranker prompt): a compare's reranker
#: (:mod:`refsight.compare.rerank`) and the rerank endpoints (:mod:`refsight.ranking.rerank`) alike.
YES_NO_SYSTEM = (
    'Judge whether the Document meets the requirements based on the Query and the Instruct provided. '
    'Note that the answer can only be "yes" or "no".'
)

#: What the model decides for a query and a document (Qwen3-VL-Reranker's default instruction).
QUERY_INSTRUCTION = "Given a search query, retrieve relevant candidates that answer the query."


def yes_no_segments(query: Sequence[Any], document: Sequence[Any], instruction: str = QUERY_INSTRUCTION) -> list[Any]:
    """The yes/no prompt of one (query, document) pair, each one or more parts (texts, images) in order."""
    return [f"{YES_NO_SYSTEM}\n<Instruct>: {instruction}\n<Query>:", *query, "<Document>:", *document,
            'Answer "yes" or "no".']


def _check_visual(item: object, what: str) -> None:
    if not isinstance(item, (VisualPackage, ImageInput)):
        raise TypeError(f"{what} must be a VisualPackage or an ImageInput, not {type(item).__name__}")


def reference_prefix(references: Sequence[ModelImage]) -> list[Segment]:
    """The rubric-independent opening: the preamble, then ``Reference i:`` and each reference."""
    if not references:
        raise ValueError("a judge prompt needs at least one reference")
    segments: list[Segment] = [JUDGE_PREAMBLE + "\n"]
    for i, ref in enumerate(references, start=1):
        _check_visual(ref, f"reference {i}")
        segments += [f"Reference {i}:", ref, "\n"]
    return segments


def criteria_block(criteria: Sequence[Criterion], *, evidence_max_chars: int, n_references: int = 1) -> str:
    """The criteria, numbered, and the answer instructions (the rubric-dependent suffix)."""
    refs = "the reference" if n_references == 1 else "the references"
    # Criteria are shown as JSON strings so the model can copy them exactly into its answer.
    lines = [f"{i}. {json.dumps(c.text, ensure_ascii=False)}" for i, c in enumerate(criteria, start=1)]
    example = json.dumps(
        {"criteria": [{"criterion": "<criterion text>", "verdict": "match", "confidence": 0.9, "evidence": "<why>"}]}
    )
    return (
        "Criteria:\n"
        + "\n".join(lines)
        + f"\nFor each criterion, compare the candidate with {refs} and answer \"match\", \"mismatch\" "
        "or \"uncertain\", a confidence between 0 and 1, and short evidence "
        f"(at most {evidence_max_chars} characters, no quotes or backslashes). "
        "Keep the criteria in the order given and copy their text exactly. "
        f"Answer with JSON only, in this form:\n{example}"
    )


def build_judge_request(
    references: Sequence[ModelImage],
    candidate: ModelImage,
    criteria: Sequence[Criterion],
    *,
    evidence_max_chars: int,
    max_new_tokens: int,
    json_schema: dict | None = None,
    retry_reason: str | None = None,
    prefix_cache: Any = None,
) -> GenerationRequest:
    """One judging prompt. ``retry_reason`` (second attempt) is appended last, keeping the prefix, whose state
    ``prefix_cache`` (a :class:`~refsight.backends.prefix.PrefixCache`) keeps and reuses."""
    _check_visual(candidate, "the candidate")
    if not criteria:
        raise ValueError("a judge prompt needs at least one criterion")
    segments = reference_prefix(references)
    segments += ["Candidate:", candidate, "\n"]
    text = criteria_block(criteria, evidence_max_chars=evidence_max_chars, n_references=len(references))
    if retry_reason:
        text += f"\nYour previous answer was rejected ({retry_reason}). Reply with the JSON object only."
    segments.append(text)
    # The reference prefix (preamble and references) is the part a backend may reuse state for.
    return GenerationRequest(
        segments=segments, max_new_tokens=max_new_tokens, json_schema=json_schema,
        prefix_segments=len(reference_prefix(references)), prefix_cache=prefix_cache,
    )


def build_attribute_request(
    item: ModelImage,
    attributes: Mapping[str, Sequence[str] | None],
    *,
    value_max_chars: int,
    max_new_tokens: int,
    json_schema: dict | None = None,
    retry_reason: str | None = None,
) -> GenerationRequest:
    """A prompt asking the VLM to describe one image as an attribute record."""
    _check_visual(item, "the image")
    lines = []
    for name, values in attributes.items():
        choices = f"one of {', '.join(json.dumps(v) for v in values)}" if values else f"at most {value_max_chars} characters"
        lines.append(f'- "{name}": {choices}, or "unknown"')
    text = (
        "Describe the image with these attributes:\n"
        + "\n".join(lines)
        + "\nAnswer with a JSON object holding exactly these keys, in this order, and nothing else."
    )
    if retry_reason:
        text += f"\nYour previous answer was rejected ({retry_reason}). Reply with the JSON object only."
    return GenerationRequest(
        segments=["Image:", item, "\n", text], max_new_tokens=max_new_tokens, json_schema=json_schema
    )
