"""``refsight ingest`` in-process, on a real tiny model: sources, bad files, skip-before-encode,
re-runs that encode nothing, and a first search and compare that do no reference work."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from image_corpus import CORPUS_ACCEPTED, CORPUS_REJECTED
from ingest_helpers import MODEL, make_images, snapshot, stored_packages
from refsight import Engine
from refsight.cli import main
from refsight.errors import InvalidInputError
from refsight.ingest import IngestItem, list_source


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    return make_images(tmp_path_factory.mktemp("images"), 24)


def _path_list(tmp_path: Path, paths: list[Path]) -> Path:
    listing = tmp_path / "paths.txt"
    listing.write_text("# the references\n\n" + "\n".join(str(p) for p in paths) + "\n")
    return listing


def test_every_good_image_is_stored_once_with_its_package_vector_and_record(tmp_path, images, bad_image_corpus):
    source = _path_list(tmp_path, images + list(bad_image_corpus.values()))
    errors = tmp_path / "errors.jsonl"
    with Engine(tmp_path / "store", model=MODEL) as engine:
        report = engine.ingest(source, errors_file=errors, batch_size=4)
        good = len(images) + len(CORPUS_ACCEPTED)
        assert report.to_dict() | {"wall_s": 0, "images_per_s": 0, "encode_s": 0, "hash_s": 0, "write_s": 0} == {
            "images": good + len(CORPUS_REJECTED), "added": good, "cached": 0, "failed": len(CORPUS_REJECTED),
            "encode_s": 0, "wall_s": 0, "images_per_s": 0, "actors": 0, "mode": "in-process",
            "vectors": good, "records": good, "hash_s": 0, "write_s": 0, "errors_file": str(errors),
        }
        refused = [json.loads(line) for line in errors.read_text().splitlines()]
        assert sorted(Path(r["input"]).name for r in refused) == sorted(bad_image_corpus[n].name for n in CORPUS_REJECTED)
        assert all(r["error"] for r in refused)
        assert engine.verify().ok
        assert len(engine.references()) == good
    held = snapshot(tmp_path / "store")
    shas = {sha for _, _, sha, _ in held["references"]}
    assert len(shas) == good and {sha for _, sha in held["packages"]} == shas
    assert {sha for _, sha in held["vectors"]} == shas and {sha for sha, _, _ in held["records"]} == shas
    assert len(held["links"]) == len(held["entries"]) == good  # linked, and indexed for search already


def test_a_rerun_encodes_nothing_and_changes_nothing(tmp_path, images):
    with Engine(tmp_path / "store", model=MODEL) as engine:
        first = engine.ingest(images[0].parent.parent, batch_size=8)
        before = snapshot(tmp_path / "store")
        misses = engine.stats().to_dict()["counters"]["misses"] if "counters" in engine.stats().to_dict() else None
        again = engine.ingest(images[0].parent.parent, batch_size=8)
    assert first.added == len(images)
    assert (again.added, again.cached, again.vectors, again.records) == (0, len(images), 0, 0)
    assert snapshot(tmp_path / "store") == before
    if misses is not None:
        with Engine(tmp_path / "store", model=MODEL) as engine:
            assert engine.stats().to_dict()["counters"]["misses"] == misses


def test_an_interrupted_ingest_resumes_with_only_the_missing_work(tmp_path, images):
    store = tmp_path / "store"
    with Engine(store, model=MODEL) as engine:
        # A crash after some packages, vectors and records were written for half the images.
        engine.ingest([IngestItem(str(p), name=p.name) for p in images[:12]], batch_size=4)
        ref = engine.reference("ref0002")
        engine.remove(ref.ref_id)  # the reference row is gone; its package went with it (as a crash before the row)
        report = engine.ingest(images[0].parent.parent, batch_size=4)
    # Directory ids carry the folder: the first run's ids were plain names, so only the rows are new.
    assert report.added == len(images) - 12 + 1 and report.cached == 11 and report.failed == 0
    held = snapshot(store)
    assert {sha for _, sha in held["packages"]} >= {sha for _, _, sha, _ in held["references"]}


def test_sources_directory_path_list_csv_and_parquet_name_the_same_images(tmp_path, images):
    root = images[0].parent.parent
    from_dir = list_source(root)
    assert [i.path for i in from_dir] == sorted(str(p) for p in images)  # sorted walk: sub/ before top/
    assert from_dir[0].name == "sub.ref0001.png"
    listing = tmp_path / "list.txt"
    listing.write_text(f"# absolute paths stay as they are\n{images[0]}\n")
    assert [i.path for i in list_source(listing)] == [str(images[0])]
    relative = tmp_path / "rel.txt"
    shutil.copy(images[1], tmp_path / "one.png")
    relative.write_text("one.png\n")
    assert [i.path for i in list_source(relative)] == [str(tmp_path / "one.png")]

    manifest = tmp_path / "manifest.csv"
    with open(manifest, "w", newline="") as f:
        writer = csv.DictWriter(f, ["path", "ref_id", "sku", "colour"])
        writer.writeheader()
        writer.writerow({"path": str(images[0]), "ref_id": "sku-1", "sku": "1", "colour": "red"})
        writer.writerow({"path": str(images[1]), "ref_id": "", "sku": "2", "colour": ""})
    items = list_source(manifest)
    assert items[0] == IngestItem(str(images[0]), ref_id="sku-1", metadata={"sku": "1", "colour": "red"})
    assert items[1] == IngestItem(str(images[1]), ref_id=None, metadata={"sku": "2"})

    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "manifest.parquet"
    pq.write_table(pa.table({"path": [str(images[2])], "ref_id": ["p-3"], "price": [9.5]}), parquet)
    assert list_source(parquet) == [IngestItem(str(images[2]), ref_id="p-3", metadata={"price": 9.5})]

    bad = tmp_path / "bad.csv"
    bad.write_text("file,id\nx.png,1\n")
    for source, reason in ((bad, "'path' column"), (tmp_path / "absent", "no such file")):
        with pytest.raises(InvalidInputError, match=reason):
            list_source(source)


def test_a_manifest_sets_ids_and_metadata_and_search_filters_on_them(tmp_path, images):
    manifest = tmp_path / "manifest.csv"
    with open(manifest, "w", newline="") as f:
        writer = csv.DictWriter(f, ["path", "ref_id", "shelf"])
        writer.writeheader()
        for i, path in enumerate(images[:6]):
            writer.writerow({"path": str(path), "ref_id": f"part-{i}", "shelf": "a" if i < 3 else "b"})
        writer.writerow({"path": str(images[6]), "ref_id": "part-0", "shelf": "c"})  # a second image under a taken id
    with Engine(tmp_path / "store", model=MODEL) as engine:
        report = engine.ingest(manifest, errors_file=tmp_path / "errors.jsonl")
        assert (report.added, report.failed) == (6, 1)
        assert "another image of this ingest" in (tmp_path / "errors.jsonl").read_text()
        assert engine.reference("part-4").metadata == {"shelf": "b"}
        hits = engine.search("a photo", k=10, where={"shelf": "a"})
        assert sorted(h.ref_id for h in hits.hits) == ["part-0", "part-1", "part-2"]


def test_the_same_picture_at_two_paths_is_encoded_once(tmp_path, images):
    copy = tmp_path / "copy.png"
    shutil.copy(images[0], copy)
    with Engine(tmp_path / "store", model=MODEL) as engine:
        report = engine.ingest([IngestItem(str(images[0]), name="a.png"), IngestItem(str(copy), name="b.png")])
        assert (report.added, report.cached, report.failed) == (1, 1, 0)
        a, b = engine.reference("a"), engine.reference("b")
        assert a.image_sha256 == b.image_sha256 and a.packages == b.packages


def test_the_first_search_and_compare_after_an_ingest_do_no_reference_work(tmp_path, images):
    store = tmp_path / "store"
    with Engine(store, model=MODEL) as engine:
        engine.ingest(images[0].parent.parent)
    candidate = make_images(tmp_path / "new", 1, seed=99)[0]  # not a reference: its encode is the one miss
    with Engine(store, model=MODEL) as engine:
        engine.store.counters.flush()
        before = engine.store.catalog.counters()
        embedder = engine.retrieval.embedder()
        embedded: list[int] = []
        original = embedder.embed_images
        embedder.embed_images = lambda batch: embedded.append(len(batch)) or original(batch)  # count, then run
        try:
            assert engine.index().embedded_now == 0  # the index is already in step with the catalog
            engine.search("a red square", k=3)
            result = engine.compare(candidate, criteria="same colours", top_k=3)
        finally:
            del embedder.embed_images
        engine.store.counters.flush()
        counters = {k: v - before.get(k, 0) for k, v in engine.store.catalog.counters().items()}
        # The candidate is the only image embedded (its query vector) and encoded; every
        # reference package was a hit, every reference record was stored already.
        assert embedded == [1]
        assert counters.get("misses", 0) == 1 and counters.get("hits", 0) >= 3
        assert engine.attribute_records.store.misses == 0
        assert len(result.results) == 3


def test_refsight_ingest_prints_one_json_report_and_exits_1_on_refused_files(tmp_path, images, bad_image_corpus, capsys):
    source = _path_list(tmp_path, images[:4] + [bad_image_corpus["zero_bytes"]])
    errors = tmp_path / "errors.jsonl"
    code = main(["--store", str(tmp_path / "store"), "ingest", str(source), "--model", MODEL, "--errors", str(errors)])
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert code == 1 and (report["added"], report["failed"]) == (4, 1)
    assert set(report) >= {"images", "added", "cached", "failed", "encode_s", "wall_s", "images_per_s", "actors"}
    assert "zero_bytes" in errors.read_text() and "1 image(s) refused" in out.err
    assert main(["--store", str(tmp_path / "store"), "ingest", str(tmp_path / "absent"), "--model", MODEL]) == 1


def test_ingest_writes_through_the_catalog_interface_to_a_postgresql_catalog(tmp_path, images, postgres):
    # The driver writes through Catalog / PackageCache only: a shared PostgreSQL catalog with a blob
    # directory takes the same ingest, and a second replica sees every reference without encoding.
    blobs = tmp_path / "blobs"
    with Engine(blobs, catalog=postgres, local_dir=tmp_path / "replica-a", model=MODEL) as engine:
        report = engine.ingest(images[0].parent.parent, batch_size=8)
        assert (report.added, report.failed) == (len(images), 0)
        assert engine.verify().ok and len(engine.references()) == len(images)
    with Engine(blobs, catalog=postgres, local_dir=tmp_path / "replica-b", model=MODEL) as engine:
        again = engine.ingest(images[0].parent.parent, batch_size=8)
        # Packages and references are shared: nothing to encode; this replica's derived data is its own.
        assert (again.added, again.cached, again.vectors, again.records) == (0, len(images), len(images), len(images))
        assert len(engine.search("a photo", k=5).hits) == 5


def test_a_killed_ingest_rerun_encodes_only_what_is_missing(tmp_path, images):
    import os
    import signal
    import subprocess
    import sys
    import time

    store = tmp_path / "store"
    root = images[0].parent.parent
    command = [sys.executable, "-m", "refsight.cli", "--store", str(store), "ingest", str(root), "--model", MODEL,
               "--batch-size", "4", "--errors", str(tmp_path / "errors.jsonl")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    try:
        deadline = time.monotonic() + 300
        while stored_packages(store) < 4 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)  # mid-job, as a crash (a Ctrl-C stops at the same points)
    finally:
        process.wait()
    stored = stored_packages(store)
    assert 4 <= stored < len(images), "the ingest was not killed mid-job"
    with Engine(store, model=MODEL) as engine:
        report = engine.ingest(root, batch_size=4)
        assert engine.verify().ok and len(engine.references()) == len(images)
    assert report.added == len(images) - stored  # every package already on disk was kept, not encoded again
    assert (report.added + report.cached, report.failed) == (len(images), 0)


def test_metadata_that_cannot_be_encoded_is_an_error_row_and_the_errors_file_stays_utf8(tmp_path, images):
    import os

    odd = tmp_path / os.fsdecode(b"odd-\xff.png")  # undecodable bytes: still a path to read
    odd.write_bytes(b"not an image")
    items = [IngestItem(str(images[0]), name="good.png"), IngestItem(str(images[1]), metadata={"k": "\udcff"}),
             IngestItem(str(odd))]
    errors = tmp_path / "errors.jsonl"
    with Engine(tmp_path / "store", model=MODEL) as engine:
        report = engine.ingest(items, errors_file=errors)
        assert (report.added, report.failed) == (1, 2)
        assert [r.ref_id for r in engine.references()] == ["good"]
    rows = [json.loads(line) for line in errors.read_bytes().decode("utf-8").splitlines()]
    assert "not valid Unicode" in rows[0]["error"] and "\ufffd" in rows[1]["input"]
