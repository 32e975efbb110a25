"""The compare pipeline: recall → prefilter → rerank → judge, counted exactly over 1,000 references.

The counting backend (tests/engine/fake_pipeline.py) is a fake for orchestration only; the
model paths of the reranker are proven on a real tiny model in tests/backends/test_score_yes_no.py.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from refsight import Engine
from refsight.inputs.images import load_image
from refsight.backends.registry import register_backend
from refsight.cli import main
from refsight.errors import BackendError, InvalidInputError

from fake_pipeline import CountingBackend, PixelEmbedder, pattern_of

N = 1000


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def counting_store(tmp_path_factory):
    """1,000 generated references, their VLM attribute records computed at ingest (custom schema from a file)."""
    root = tmp_path_factory.mktemp("pipeline")
    schema = root / "schema.yaml"
    schema.write_text("color_pattern: [tabby, solid]\n")
    engine = Engine(root / "store", model="counting", embedder=PixelEmbedder(), attribute_schema=schema)
    # Handed to this engine alone, not registered: no fake model in the process-wide registry.
    backend = engine.models.provide("counting", CountingBackend("counting"))
    added = list(engine.add_many([_png(i) for i in range(N)], ids=[f"r{i}" for i in range(N)], attributes=("vlm",)))
    assert all(not hasattr(r, "error") for r in added)
    assert backend.attribute_requests == N  # computed at ingest, once per reference
    yield engine, backend, {r.image_sha256: r.ref_id for r in added}
    engine.close()


def _reset(backend: CountingBackend) -> None:
    backend.judge_requests = backend.attribute_requests = 0
    backend.scored.clear()


@pytest.mark.slow  # the module's store of 1000 references takes seconds to fill
def test_rerank_20_top_3_over_1000_references_scores_20_and_judges_3(counting_store):
    engine, backend, _ = counting_store
    _reset(backend)
    out = engine.compare(_png(5000), criteria="looks alike\nsame colours", top_k=3, rerank=20, attributes=("vlm",))
    assert len(backend.scored) == 20 and backend.judge_requests == 3 and out.vlm_calls == 3
    assert backend.attribute_requests == 1  # the candidate's record only: references' were stored at ingest
    assert out.stages == {"recalled": 20, "filtered": 0, "reranked": 20, "judged": 3}
    assert set(out.timings_ms) >= {"recall", "rerank", "candidate_encode", "reference_load", "attributes", "judge"}
    stages = [r["stage"] for r in out.results]
    assert stages == ["judged"] * 3 + ["reranked"] * 17
    judged, rest = out.results[:3], out.results[3:]
    # The judge got the three best reranked; results are sorted by score, ties by rerank score.
    assert min(r["rerank_score"] for r in judged) >= max(r["rerank_score"] for r in rest)
    keys = [(-r["score"], -r["rerank_score"]) for r in judged]
    assert keys == sorted(keys)
    assert [r["rerank_score"] for r in rest] == sorted((r["rerank_score"] for r in rest), reverse=True)
    assert all(r["recall_score"] is not None for r in out.results)


@pytest.mark.slow  # the module's store of 1000 references takes seconds to fill
def test_recall_deeper_than_rerank_reports_the_rest_as_recalled(counting_store):
    engine, backend, _ = counting_store
    _reset(backend)
    out = engine.compare(_png(11), criteria="looks alike", top_k=3, rerank=20, recall_k=50, attributes=[])
    assert len(backend.scored) == 20 and backend.judge_requests == 3
    assert out.stages == {"recalled": 50, "filtered": 0, "reranked": 20, "judged": 3}
    assert [r["stage"] for r in out.results] == ["judged"] * 3 + ["reranked"] * 17 + ["recalled"] * 30
    rest = [r["recall_score"] for r in out.results[20:]]
    assert rest == sorted(rest, reverse=True) and all(r["rerank_score"] is None for r in out.results[20:])


@pytest.mark.slow  # the module's store of 1000 references takes seconds to fill
def test_required_mismatch_settled_by_the_records_never_reaches_the_reranker(counting_store):
    engine, backend, by_sha = counting_store
    _reset(backend)
    candidate = _png(5000)
    rubric = [{"text": "same color pattern", "required": True}, {"text": "looks alike"}]
    out = engine.compare(candidate, criteria=rubric, top_k=3, rerank=20, attributes=("vlm",))
    filtered = [r for r in out.results if r["stage"] == "filtered"]
    assert filtered, "some of the 20 recalled references have the other (hash-decided) pattern"
    assert out.stages["filtered"] == len(filtered) and out.stages["reranked"] == 20 - len(filtered)
    assert len(backend.scored) == 20 - len(filtered) and backend.judge_requests == 3
    scored = {by_sha[sha] for sha in backend.scored}
    assert not scored & {r["ref_id"] for r in filtered}
    for r in filtered:
        assert r["filtered_by"] == ["same color pattern"] and r["score"] == 0 and r["rerank_score"] is None
        sha = engine.reference(r["ref_id"]).image_sha256
        assert pattern_of(sha) != pattern_of(load_image(candidate).sha256)
    assert [r["stage"] for r in out.results][-len(filtered):] == ["filtered"] * len(filtered)


@pytest.mark.slow  # the module's store of 1000 references takes seconds to fill
def test_embedding_reranker_needs_no_vlm_scoring(counting_store):
    engine, backend, _ = counting_store
    _reset(backend)
    out = engine.compare(_png(7), criteria="looks alike", top_k=2, rerank=10, reranker="embedding", attributes=[])
    assert backend.scored == [] and backend.judge_requests == 2
    assert out.stages["reranked"] == 10 and out.results[0]["ref_id"] == "r7"  # its own image: cosine 1
    assert out.results[0]["rerank_score"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.slow  # the module's store of 1000 references takes seconds to fill
def test_rerank_needs_top_k_and_a_larger_shortlist(counting_store):
    engine, _, _ = counting_store
    with pytest.raises(InvalidInputError, match="top_k"):
        engine.compare(_png(1), criteria="x", rerank=5, attributes=[])
    with pytest.raises(InvalidInputError, match="fewer than top_k"):
        engine.compare(_png(1), criteria="x", top_k=5, rerank=2, attributes=[])
    with pytest.raises(InvalidInputError, match="recall"):
        engine.compare(_png(1), criteria="x", top_k=2, recall="pixels", attributes=[])


def test_the_base_backend_refuses_yes_no_scoring():
    from refsight.backends.toy import ToyBackend

    with pytest.raises(BackendError, match="not supported"):
        ToyBackend().score_yes_no([])


def test_add_without_attributes_loads_no_attribute_model(tmp_path, pixel_embedder):
    with Engine(tmp_path / "s", model="toy", embedder=pixel_embedder) as engine:
        engine.add(_png(1), ref_id="a")
        assert not engine.attribute_records.opened  # the ingest hook is not even built


def test_cli_rerank_flags(tmp_path, capsys, backend_registry):
    register_backend("counting", lambda name, **options: CountingBackend(name))
    store = tmp_path / "store"
    paths = []
    for i in range(6):
        path = tmp_path / f"p{i}.png"
        path.write_bytes(_png(i))
        paths.append(str(path))
    assert main(["add", *paths, "--store", str(store), "--model", "counting", "--attributes", "none", "--json"]) == 0
    capsys.readouterr()
    args = ["compare", paths[2], "--top-k", "2", "--rerank", "4", "--recall", "image", "--store", str(store),
            "--model", "counting", "--criteria", "alike", "--no-attributes", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stages"] == {"recalled": 4, "filtered": 0, "reranked": 4, "judged": 2}
    assert main(args[:-1]) == 0  # the table: a ranking line for every reference
    table = capsys.readouterr().out
    assert "#1 " in table and "#4 " in table and table.count("reranked") == 2
    assert main(["compare", paths[2], "--rerank", "4", "--store", str(store), "--criteria", "a"]) == 2
