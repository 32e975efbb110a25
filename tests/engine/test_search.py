"""`refsight search` with the real offline embedder, and the index following adds and removes."""

from __future__ import annotations

import json

import pytest

from refsight import Engine
from refsight.cli import main
from refsight.samples import sample_paths


@pytest.fixture(scope="module")
def photo_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("search") / "store"
    with Engine(store, model="toy") as engine:
        for name, path in sample_paths().items():
            meta = {"kind": "animal" if name in ("chelsea", "horse") else "other"}
            engine.add(path, ref_id=name, metadata=meta)
    return store


@pytest.mark.parametrize(
    "query,expected", [("a cat", "chelsea"), ("a cup of coffee", "coffee"), ("a rocket", "rocket")]
)
def test_text_search_ranks_the_right_photo_first(photo_store, capsys, query, expected):
    assert main(["search", query, "--k", "3", "--store", str(photo_store), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["results"][0]["ref_id"] == expected
    assert len(out["results"]) == 3 and out["embedder"]


def test_where_filter_and_image_query(photo_store, capsys):
    assert main(["search", "a cat", "--where", "kind=other", "--store", str(photo_store), "--json"]) == 0
    ids = [r["ref_id"] for r in json.loads(capsys.readouterr().out)["results"]]
    assert ids and "chelsea" not in ids and "horse" not in ids
    assert (
        main(["search", "--image", str(sample_paths()["coffee"]), "--k", "1", "--store", str(photo_store), "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["results"][0]["ref_id"] == "coffee"


def test_removed_reference_leaves_every_index_and_added_one_joins(tmp_path, capsys):
    store = tmp_path / "store"
    paths = sample_paths()
    with Engine(store, model="toy") as engine:
        for name in ("chelsea", "coffee", "rocket"):
            engine.add(paths[name], ref_id=name)
        assert engine.search("a cat", k=1).ref_ids[0] == "chelsea"
    # Removal in another process (the CLI) must drop it from the index at once.
    assert main(["remove", "chelsea", "--store", str(store)]) == 0
    with Engine(store, model="toy") as engine:
        ids = engine.search("a cat", k=3).ref_ids
        assert "chelsea" not in ids and sorted(ids) == ["coffee", "rocket"]
        engine.add(paths["chelsea"], ref_id="cat-again")
        assert engine.search("a cat", k=1).ref_ids[0] == "cat-again"
    # The index files can always be rebuilt from the store.
    for index_file in (store / "retrieval").rglob("hnsw.bin"):
        index_file.write_bytes(b"garbage")
    capsys.readouterr()
    assert main(["index", "--rebuild", "--store", str(store), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["indexed"] == 3 and report["embedded_now"] == 3 and report["removed_now"] == 0
    # nothing changed since: the next sync indexes nothing
    assert main(["index", "--store", str(store)]) == 0
    assert capsys.readouterr().out.strip().endswith("(0 indexed now, 0 removed)")


def test_search_needs_exactly_one_query(tmp_path, capsys):
    assert main(["search", "--store", str(tmp_path / "s")]) == 2  # a usage error
    assert "TEXT query or --image" in capsys.readouterr().err
