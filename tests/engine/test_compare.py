"""`refsight compare` through the engine: cached vs fresh verdicts, counted judgments, rubric errors."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from compare_helpers import cached_and_fresh, without_timings
from refsight import Engine, RubricError
from refsight.cli import main

FAMILIES = ("tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl", "tiny-smolvlm")
RUBRIC = "short fur; triangular ears"


@pytest.mark.parametrize("model", FAMILIES)
def test_cached_and_no_cache_compare_give_identical_verdict_json(tmp_path, real_photo, model):
    with cached_and_fresh(tmp_path / "store", real_photo, model) as (_, _, _, cached, fresh):
        assert [r["reference_cached"] for r in cached["results"]] == [True, True]
        assert [r["reference_cached"] for r in fresh["results"]] == [False, False]
        assert without_timings(cached) == without_timings(fresh)
        assert cached["random_weights"] is True
        for result in cached["results"]:
            assert [c["criterion"] for c in result["criteria"]] == ["short fur", "triangular ears"]
            for c in result["criteria"]:
                assert c["verdict"] in ("match", "mismatch", "uncertain") and 0 <= c["confidence"] <= 1
                assert c["source"] == "vlm"


def test_compare_cli_json_shape_and_table(tmp_path, real_photo, capsys):
    store = tmp_path / "store"
    for name in ("chelsea", "coffee"):
        path = tmp_path / f"{name}.png"
        # Full size: the ImageNet classifier needs real detail to be confident.
        real_photo(name, size=None).save(path)
        assert main(["add", str(path), "--store", str(store), "--model", "tiny-qwen2-vl"]) == 0
    candidate = tmp_path / "candidate.png"
    real_photo("chelsea", size=None).transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(candidate)
    (tmp_path / "rubric.yaml").write_text(
        "criteria:\n  - text: short fur\n    weight: 2\n  - text: is a cat\n    required: true\n"
    )
    capsys.readouterr()
    code = main(
        [
            "compare",
            str(candidate),
            "--ref",
            "chelsea",
            "--ref",
            "coffee",
            "--criteria",
            f"@{tmp_path / 'rubric.yaml'}",
            "--store",
            str(store),
            "--model",
            "tiny-qwen2-vl",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(out) == {"candidate_sha256", "model", "random_weights", "results", "timings_ms", "vlm_calls", "stages"}
    assert set(out["timings_ms"]) >= {"candidate_encode", "reference_load", "judge", "prefilter"}
    # "is a cat" is required and settled by the real ImageNet attribute records, which `add`
    # computed: coffee is dropped before the judge (reported, never silent), chelsea is judged.
    assert [r["ref_id"] for r in out["results"]] == ["chelsea", "coffee"]
    assert out["stages"] == {"recalled": 0, "filtered": 1, "reranked": 0, "judged": 1} and out["vlm_calls"] >= 1
    chelsea, coffee = out["results"]
    assert set(chelsea) == {"ref_id", "score", "reference_cached", "criteria", "stage", "recall_score", "rerank_score"}
    assert chelsea["stage"] == "judged" and chelsea["reference_cached"] is True and 0 <= chelsea["score"] <= 1
    for c in chelsea["criteria"]:
        assert set(c) == {"criterion", "verdict", "confidence", "evidence", "source"}
    cat = next(c for c in chelsea["criteria"] if c["criterion"] == "is a cat")
    assert cat["source"] == "attributes" and cat["verdict"] == "match"
    assert coffee["stage"] == "filtered" and coffee["filtered_by"] == ["is a cat"] and coffee["score"] == 0
    assert [(c["criterion"], c["verdict"], c["source"]) for c in coffee["criteria"]] == [("is a cat", "mismatch", "attributes")]

    code = main(
        [
            "compare",
            str(candidate),
            "--ref",
            "chelsea",
            "--criteria",
            "short fur",
            "--store",
            str(store),
            "--model",
            "tiny-qwen2-vl",
            "--force-vlm",
        ]
    )
    table = capsys.readouterr().out
    assert code == 0 and "RANDOM weights" in table and "chelsea" in table and "short fur" in table


@pytest.mark.parametrize(
    "criteria,needle",
    [
        ("", "empty"),
        ("fur; Fur", "duplicate"),
        ('[{"text": "fur", "weight": -1}]', "weight"),
        ("x" * 9000, "characters"),
    ],
)
def test_bad_rubrics_fail_before_any_model_work(tmp_path, real_photo, capsys, criteria, needle):
    store = tmp_path / "store"
    path = tmp_path / "a.png"
    real_photo("coffee", size=(32, 32)).save(path)
    main(["add", str(path), "--store", str(store), "--model", "toy"])
    capsys.readouterr()
    code = main(
        ["compare", str(path), "--ref", "a", "--criteria", criteria, "--store", str(store), "--model", "toy", "--json"]
    )
    captured = capsys.readouterr()
    assert code == 1 and needle in captured.err.lower() and "Traceback" not in captured.err
    with Engine(store, model="toy") as engine, pytest.raises(RubricError):
        engine.compare(path, criteria=criteria, ref_ids=["a"])


def _tiny_png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_two_stage_compare_costs_the_same_judgments_over_1000_as_over_10_references(tmp_path, pixel_embedder):
    calls = {}
    for n in (10, 1000):
        with Engine(tmp_path / f"store-{n}", model="toy", embedder=pixel_embedder) as engine:
            results = list(engine.add_many([_tiny_png(i) for i in range(n)], ids=[f"r{i}" for i in range(n)]))
            assert all(not hasattr(r, "error") for r in results)
            out = engine.compare(_tiny_png(3), criteria="same colours", top_k=3, attributes=[])
            calls[n] = out.vlm_calls
            assert len(out.results) == 3 and [h["ref_id"] for h in out.recalled] == [r["ref_id"] for r in out.results]
            # The candidate is reference r3's image: retrieval must recall it first.
            assert out.recalled[0]["ref_id"] == "r3"
    assert calls[10] == calls[1000] > 0
