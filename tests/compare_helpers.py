"""One compare of a candidate against two stored photos, with cached references and re-encoded ones."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from PIL import Image

from refsight import Engine

RUBRIC = "short fur; triangular ears"


def without_timings(result: dict) -> dict:
    """A compare's JSON without what may differ between two equal runs (timings, which references were cached)."""
    return {
        **{k: v for k, v in result.items() if k not in ("timings_ms", "results")},
        "results": [{k: v for k, v in r.items() if k != "reference_cached"} for r in result["results"]],
    }


@contextmanager
def cached_and_fresh(store, real_photo, model: str) -> Iterator[tuple[Engine, dict, Image.Image, dict, dict]]:
    """``(engine, references, candidate, cached, fresh)``: chelsea and coffee stored, a flipped chelsea compared
    with the references' packages (``cached``) and with them re-encoded (``fresh``); the engine stays open."""
    refs = {name: real_photo(name, size=(80, 64)) for name in ("chelsea", "coffee")}
    candidate = real_photo("chelsea", size=(72, 56)).transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    with Engine(store, model=model) as engine:
        for name, image in refs.items():
            engine.add(image, ref_id=name)
        kwargs = dict(criteria=RUBRIC, ref_ids=list(refs), attributes=[], evidence_max_chars=16)
        cached = engine.compare(candidate, **kwargs).to_dict()
        fresh = engine.compare(candidate, use_cache=False, **kwargs).to_dict()
        yield engine, refs, candidate, cached, fresh
