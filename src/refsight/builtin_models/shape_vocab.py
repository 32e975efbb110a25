"""The vocabulary of a real-shape built-in model (``shape-smolvlm-256m``): a few thousand BPE tokens.

The tiny test models keep their 512-token byte-level BPE (:mod:`.tokenizer`'s fixed corpus;
their golden outputs depend on it). With that vocabulary a JSON verdict is spelled almost
byte by byte: a random-weight model, constrained to the verdict schema, took about 220
decode steps for the demo's four criteria (about 50 with this vocabulary), which timed the
tokenizer rather than the model. A real model's vocabulary has tens of thousands of tokens, so
``shape-smolvlm-256m`` trains a larger one here, on a corpus shaped like what it is asked to
write: verdict JSON over rubric criteria (the ImageNet labels refsight ships give it a thousand
everyday nouns), judge instructions and the chat template's words. Merges may cross spaces
and punctuation (no word pre-split), up to :attr:`Vocabulary.max_token_length` bytes, so a
token can hold a JSON field's skeleton (``", "verdict": "``); a verdict is then a few dozen
tokens.

The corpus is data, built deterministically; :meth:`Vocabulary.fingerprint` is what a build id
hashes, so a changed corpus or size rebuilds the model instead of reusing a stale cache entry.
``shape-qwen2-vl-2b`` keeps the tiny vocabulary: its llama.cpp GGUFs pre-split words as Qwen2's
regex does, which a vocabulary merged across words would not match.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

__all__ = ["Vocabulary", "shape_vocabulary"]


@dataclass(frozen=True)
class Vocabulary:
    """What a built-in tokenizer is trained on: the corpus, the vocabulary size, the longest token."""

    corpus: str
    size: int
    #: Merges cross word boundaries (no pre-split), each token at most this many bytes.
    max_token_length: int

    def fingerprint(self) -> dict[str, object]:
        """The fields as a build id hashes them (the corpus by its SHA-256)."""
        digest = hashlib.sha256(self.corpus.encode()).hexdigest()
        return {"corpus_sha256": digest, "size": self.size, "max_token_length": self.max_token_length}


#: Rubric criteria of the kinds users write (appearance, product checks), besides "is a <label>".
_CRITERIA = (
    "is a cat", "short fur", "triangular ears", "dark forehead stripes", "same colour", "same color", "same shape",
    "same product", "same label", "same logo", "same brand", "no scratches", "no dents", "no stains", "no damage",
    "the label matches", "the text matches", "the colour matches", "long hair", "white background", "round shape",
    "striped pattern", "wooden table", "metal surface", "glass bottle", "plastic cap", "blue sky", "green leaves",
    "same number of objects", "same size", "same orientation", "the person wears a helmet", "the box is sealed",
)
_VERDICTS = ("match", "mismatch", "uncertain")
_CONFIDENCES = (0, 1, 0.5, 0.9, 0.25, 0.75, 0.1, 0.8, 0.95, 0.6, 0.35, 0.05)
_EVIDENCE = (
    "same fur", "ears match", "stripes differ", "colour differs", "no cat visible", "looks the same", "different shape",
    "label is blurred", "similar pattern", "clearly visible", "not visible", "same animal", "other object", "too dark",
    "partly hidden", "the same", "differs", "both white", "cropped", "mirrored", "no label", "blue", "red", "green",
)
#: The judge's instructions and the chat templates' words, as the prompts put them.
_PROMPT_LINES = (
    "You compare a candidate image with reference images, one criterion at a time.",
    "Reference 1:\nReference 2:\nCandidate:\nCriteria:",
    'For each criterion, compare the candidate with the reference and answer "match", "mismatch" or "uncertain", '
    "a confidence between 0 and 1, and short evidence (at most 16 characters, no quotes or backslashes).",
    "Keep the criteria in the order given and copy their text exactly. Answer with JSON only, in this form:",
    "User: Assistant: System: You are a helpful assistant. Describe the image. What is in the picture?",
)


def _labels() -> list[str]:
    """The first name of each ImageNet class refsight ships (``tabby``, ``golden retriever`` ...)."""
    text = resources.files("refsight.embedders").joinpath("imagenet_labels.txt").read_text("utf-8")
    return [line.split(",")[0].strip() for line in text.splitlines() if line.strip()]


def _verdict_line(criteria: list[str], n: int) -> str:
    """The ``n``-th verdict answer: one to four entries, every field value drawn in turn from the lists."""
    entries = [
        {
            "criterion": criteria[(n + 37 * m) % len(criteria)],
            "verdict": _VERDICTS[(n + m) % len(_VERDICTS)],
            "confidence": _CONFIDENCES[(n + m) % len(_CONFIDENCES)],
            "evidence": _EVIDENCE[(n * 5 + m) % len(_EVIDENCE)],
        }
        for m in range(1 + n % 4)
    ]
    return json.dumps({"criteria": entries})


def _corpus() -> str:
    """Per criterion, its numbered line as the judge prompt shows it and one verdict answer; then the prompts."""
    criteria = [*_CRITERIA, *(f"is a {label}" for label in _labels())]
    lines = []
    for n, criterion in enumerate(criteria):
        lines += [f"{n % 9 + 1}. {json.dumps(criterion)}", _verdict_line(criteria, n)]
    return "\n".join([*lines, *_PROMPT_LINES])


@lru_cache(maxsize=1)
def shape_vocabulary() -> Vocabulary:
    """The real-shape vocabulary: 4096 tokens of at most 32 bytes (see the module docstring)."""
    return Vocabulary(corpus=_corpus(), size=4096, max_token_length=32)
