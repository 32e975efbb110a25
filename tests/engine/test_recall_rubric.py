"""Recall by the rubric with the real offline embedder (ConSE) on the bundled photos; attributes at ingest."""

from __future__ import annotations

import pytest

from refsight import Engine
from refsight.samples import SAMPLE_NAMES, sample_path


@pytest.fixture(scope="module")
def photo_engine(tmp_path_factory):
    """The seven bundled photos as references (toy backend: no VLM matters here), ImageNet records at ingest."""
    engine = Engine(tmp_path_factory.mktemp("rubric") / "store", model="toy", embedder="conse")
    added = list(engine.add_many([sample_path(n) for n in SAMPLE_NAMES], ids=list(SAMPLE_NAMES), attributes=("imagenet",)))
    assert [r.ref_id for r in added] == list(SAMPLE_NAMES)
    yield engine
    engine.close()


def _recalled(engine, candidate: str, rubric: str, mode: str, k: int = 2) -> list[str]:
    out = engine.compare(sample_path(candidate), criteria=rubric, top_k=k, recall=mode, attributes=[])
    return [hit["ref_id"] for hit in out.recalled]


def test_a_rubric_about_fur_and_ears_recalls_chelsea_by_text(photo_engine):
    # The candidate (a coffee cup) plays no part in a text recall: the rubric alone finds the cat.
    assert _recalled(photo_engine, "coffee", "a cat with fur and pointed ears", "text")[0] == "chelsea"
    # Without naming the animal, the two furry subjects lead (measured: horse 0.26, chelsea 0.17).
    assert "chelsea" in _recalled(photo_engine, "coffee", "short fur; pointed ears", "text")


def test_both_adds_the_rubric_to_the_candidate_image(photo_engine):
    rubric = "a cat with fur and pointed ears"
    by_image = _recalled(photo_engine, "flower", rubric, "image", k=7)
    both = _recalled(photo_engine, "flower", rubric, "both", k=7)
    assert by_image[0] == both[0] == "flower"  # the candidate's own photo still leads
    assert both.index("chelsea") == 1 and both.index("chelsea") <= by_image.index("chelsea")
    # The default mode is "both", and "text" when an explicit query is given.
    out = photo_engine.compare(sample_path("flower"), criteria=rubric, top_k=7, attributes=[])
    assert [h["ref_id"] for h in out.recalled] == both


def test_imagenet_records_are_computed_at_ingest(photo_engine):
    records = photo_engine.attribute_records
    source = records.imagenet()
    chelsea = photo_engine.reference("chelsea")
    record = records.store.get(chelsea.image_sha256, source.fingerprint, source.schema_digest)
    assert record is not None and "cat" in " ".join(e["label"] for e in record["imagenet_top5"])
    before = records.store.misses
    photo_engine.compare(sample_path("chelsea"), criteria="is a cat", ref_ids=list(SAMPLE_NAMES))
    assert records.store.misses == before  # nothing computed for the references at compare time


def test_the_vlm_embedder_is_chosen_by_name_in_the_cli(tmp_path, capsys):
    import json

    from refsight.cli import main
    from refsight.samples import load_sample

    store = tmp_path / "store"
    paths = []
    for name in ("chelsea", "coffee"):
        path = tmp_path / f"{name}.png"
        load_sample(name, (64, 48)).save(path)
        paths.append(str(path))
    assert main(["add", *paths, "--store", str(store), "--model", "toy", "--attributes", "none", "--json"]) == 0
    capsys.readouterr()
    assert main(["search", "a cat", "--k", "2", "--embedder", "vlm:tiny-qwen2-vl", "--store", str(store), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["embedder"] == "vlm:tiny-qwen2-vl" and {r["ref_id"] for r in found["results"]} == {"chelsea", "coffee"}
    args = ["compare", paths[0], "--top-k", "1", "--embedder", "vlm:tiny-qwen2-vl", "--criteria", "short fur",
            "--no-attributes", "--store", str(store), "--model", "toy", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stages"]["recalled"] == 1 and len(out["recalled"]) == 1
