"""The index: exact below the threshold, hnswlib HNSW above, the database as the truth."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from refsight.errors import InvalidInputError
from refsight.retrieval import index as index_mod
from refsight.retrieval.index import AnnIndex, VectorIndex
from refsight.retrieval.vectors import VectorDB

DIM = 32
EMB = "testdigest"


def clustered(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(7).standard_normal((20, DIM))
    x = centres[rng.integers(0, 20, n)] + 0.3 * rng.standard_normal((n, DIM))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def fill(db: VectorDB, vectors: np.ndarray, namespace: str = "default", meta=lambda i: {"parity": i % 2}) -> list[int]:
    db.put_vectors(EMB, {f"sha{i}": v for i, v in enumerate(vectors)})
    return [db.upsert_entry(EMB, namespace, f"ref{i}", f"sha{i}", meta(i))[0] for i in range(len(vectors))]


def open_index(tmp_path: Path, db: VectorDB, threshold: int = 50) -> VectorIndex:
    return VectorIndex(tmp_path / "retrieval", db, EMB, "default", DIM, exact_threshold=threshold)


@pytest.fixture
def db(tmp_path):
    d = VectorDB(tmp_path / "retrieval" / "vectors.sqlite")
    yield d
    d.close()


def brute(vectors, labels, q, k):
    s = vectors @ q
    return [int(labels[i]) for i in np.argsort(-s)[:k]]


def test_exact_mode_below_threshold_matches_brute_force(tmp_path, db):
    vecs = clustered(40, 0)
    labels = fill(db, vecs)
    idx = open_index(tmp_path, db)
    assert idx.mode == "exact"
    q = clustered(1, 99)[0]
    assert [lbl for lbl, _ in idx.search(q, 5)] == brute(vecs, np.array(labels), q, 5)
    assert not (tmp_path / "retrieval" / EMB / "default" / "hnsw.bin").exists()


def test_ann_mode_above_threshold_has_high_recall_and_exact_scores(tmp_path, db):
    vecs = clustered(400, 1)
    labels = np.array(fill(db, vecs))
    idx = open_index(tmp_path, db)
    assert idx.mode == "ann"
    qs = clustered(30, 5)
    recall = np.mean([len({lbl for lbl, _ in idx.search(q, 10)} & set(brute(vecs, labels, q, 10))) / 10 for q in qs])
    assert recall >= 0.95
    top = idx.search(qs[0], 3)
    # scores are rescored with the float32 vectors, not the int8 approximations
    for lbl, score in top:
        assert score == pytest.approx(float(vecs[list(labels).index(lbl)] @ qs[0]), abs=1e-5)


def test_persisted_index_reopens_without_rebuild(tmp_path, db):
    fill(db, clustered(120, 2))
    first = open_index(tmp_path, db)
    q = clustered(1, 3)[0]
    want = first.search(q, 5)
    assert first.rebuilt  # no file yet: built from the database
    first.flush()
    second = open_index(tmp_path, db)
    assert second.search(q, 5) == want and not second.rebuilt


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete", "manifest"])
def test_damaged_index_file_is_rebuilt_from_the_database(tmp_path, db, damage):
    fill(db, clustered(120, 4))
    idx = open_index(tmp_path, db)
    q = clustered(1, 8)[0]
    want = idx.search(q, 5)
    idx.flush()
    folder = tmp_path / "retrieval" / EMB / "default"
    f = folder / "hnsw.bin"
    if damage == "truncate":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
    elif damage == "garbage":
        f.write_bytes(os.urandom(4096))
    elif damage == "delete":
        f.unlink()
    else:
        (folder / "manifest.json").write_text('{"format": 0}')
    reopened = open_index(tmp_path, db)
    assert reopened.search(q, 5) == want
    assert reopened.rebuilt


def test_stale_index_catches_up_and_never_returns_removed_refs(tmp_path, db):
    vecs = clustered(120, 6)
    labels = fill(db, vecs)
    idx = open_index(tmp_path, db)
    idx.search(vecs[0], 1)
    idx.flush()
    # after the flush: remove ten refs and add a new one, then "crash" (no flush)
    gone = {int(x) for x in labels[:10]}
    for i in range(10):
        db.delete_ref("default", f"ref{i}")
    db.put_vectors(EMB, {"new": vecs[0]})
    new_label, _ = db.upsert_entry(EMB, "default", "newref", "new", {})
    reopened = open_index(tmp_path, db)
    hits = reopened.search(vecs[0], 10)
    assert hits[0][0] == new_label  # the new entry (identical vector to the removed ref0) is found
    assert not gone & {lbl for lbl, _ in hits}
    assert not reopened.rebuilt  # reconciled, not rebuilt


def test_an_ann_search_reads_no_vectors_from_the_database(tmp_path, db):
    vecs = clustered(120, 14)
    labels = fill(db, vecs)
    idx = open_index(tmp_path, db)
    idx.search(vecs[0], 1)  # open: builds the graph
    statements: list[str] = []
    db._conn.set_trace_callback(statements.append)
    hits = idx.search(vecs[3], 5)
    assert hits[0] == (labels[3], pytest.approx(1.0, abs=1e-5))
    for label, score in hits:  # the graph's float32 scores are the exact ones
        assert score == pytest.approx(float(vecs[labels.index(label)] @ vecs[3]), abs=1e-5)
    assert statements and not any("embeddings" in s for s in statements)  # only the liveness check


def test_an_index_of_an_earlier_format_is_rebuilt_and_its_files_deleted(tmp_path, db):
    fill(db, clustered(120, 15))
    folder = tmp_path / "retrieval" / EMB / "default"
    folder.mkdir(parents=True)
    (folder / "hnsw.usearch").write_bytes(b"usearch" + bytes(1000))
    (folder / "manifest.json").write_text('{"format": 1, "library": "usearch"}')
    idx = open_index(tmp_path, db)
    assert len(idx.search(clustered(1, 16)[0], 5)) == 5 and idx.rebuilt
    assert sorted(p.name for p in folder.iterdir()) == ["hnsw.bin", "manifest.json"]


def test_a_reopened_index_rewrites_its_file_only_for_new_removals(tmp_path, db):
    fill(db, clustered(120, 17))
    first = open_index(tmp_path, db)
    first.search(clustered(1, 18)[0], 1)
    first.flush()
    db.delete_ref("default", "ref4")
    second = open_index(tmp_path, db)
    second.search(clustered(1, 18)[0], 1)
    assert second._dirty  # ref4 is newly marked deleted: the file must learn it
    second.flush()
    third = open_index(tmp_path, db)
    third.search(clustered(1, 18)[0], 1)
    assert not third._dirty and not third.rebuilt  # already marked in the file: nothing to save


def test_removed_label_is_filtered_even_before_the_index_hears_of_it(tmp_path, db):
    vecs = clustered(120, 9)
    labels = fill(db, vecs)
    idx = open_index(tmp_path, db)
    assert idx.search(vecs[5], 1)[0][0] == labels[5]
    db.delete_ref("default", "ref5")  # another process deletes; this index is not told
    assert labels[5] not in {lbl for lbl, _ in idx.search(vecs[5], 5)}


@pytest.mark.parametrize("threshold", [50, 10], ids=["exact", "ann"])
def test_labels_removed_between_listing_and_reading_are_skipped(tmp_path, db, monkeypatch, threshold):
    """Another writer removes the new labels after the index lists them and before it reads their vectors."""
    vecs = clustered(20, 15)
    labels = fill(db, vecs)
    idx = open_index(tmp_path, db, threshold)
    idx.search(vecs[0], 1)  # synced: the next sync reads only labels above these
    fill(db, clustered(3, 16))  # re-adds ref0..ref2: three new labels
    listed = VectorDB.labels

    def list_then_remove(self, *args, **kwargs):
        found = listed(self, *args, **kwargs)
        if kwargs.get("after"):
            for i in range(3):
                self.delete_ref("default", f"ref{i}")
        return found

    monkeypatch.setattr(VectorDB, "labels", list_then_remove)
    hits = idx.search(vecs[5], 25)
    assert {lbl for lbl, _ in hits} == set(labels[3:])


def test_labels_are_never_reused(db):
    db.put_vectors(EMB, {"a": np.ones(DIM, np.float32)})
    first, _ = db.upsert_entry(EMB, "default", "x", "a", {})
    db.delete_ref("default", "x")
    second, _ = db.upsert_entry(EMB, "default", "x", "a", {})
    third, replaced = db.upsert_entry(EMB, "default", "x", "a", {})
    assert first < second < third and replaced == second


def test_filtered_search_exact_and_overfetch_paths_agree(tmp_path, db, monkeypatch):
    vecs = clustered(300, 10)
    labels = np.array(fill(db, vecs))
    idx = open_index(tmp_path, db)
    allowed = db.filtered_labels(EMB, "default", {"parity": 1})
    assert len(allowed) == 150 and all(int(x) % 2 == 0 for x in allowed)  # ref i has label i+1
    q = clustered(1, 11)[0]
    exact = idx.search(q, 5, allowed)
    monkeypatch.setattr(index_mod, "EXACT_FILTER_LIMIT", 10)  # force the over-fetch path
    over = idx.search(q, 5, allowed)
    assert [lbl for lbl, _ in over] == [lbl for lbl, _ in exact]
    mask = np.isin(labels, allowed)
    assert [lbl for lbl, _ in exact] == brute(vecs[mask], labels[mask], q, 5)
    assert idx.search(q, 5, np.zeros(0, np.int64)) == []


def test_bad_queries_raise(tmp_path, db):
    fill(db, clustered(5, 12))
    idx = open_index(tmp_path, db)
    with pytest.raises(InvalidInputError, match="k"):
        idx.search(np.ones(DIM, np.float32), 0)
    with pytest.raises(InvalidInputError, match="dimension"):
        idx.search(np.ones(DIM + 1, np.float32), 3)


def test_atomic_save_leaves_no_temp_files(tmp_path):
    ann = AnnIndex(DIM)
    ann.add(np.arange(10), clustered(10, 13))
    ann.save(tmp_path / "x.bin")
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]
    loaded = AnnIndex.load(tmp_path / "x.bin", DIM)
    missing, marked = loaded.retain(np.arange(10))
    assert len(missing) == 0 and marked == 0 and len(loaded) == 10


WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    from pathlib import Path
    from refsight.retrieval.vectors import VectorDB
    from refsight.retrieval.index import VectorIndex
    root = Path(sys.argv[1]); dim = 32
    db = VectorDB(root / "retrieval" / "vectors.sqlite")
    idx = VectorIndex(root / "retrieval", db, "testdigest", "default", dim, exact_threshold=50)
    rng = np.random.default_rng(0)
    i = 0
    while True:
        v = rng.standard_normal(dim).astype(np.float32); v /= np.linalg.norm(v)
        db.put_vectors("testdigest", {f"w{i}": v})
        label, _ = db.upsert_entry("testdigest", "default", f"w{i}", f"w{i}", {})
        if i % 3 == 0:
            idx.search(v, 1)  # the index reads the new labels from the database
        if i % 7 == 3:
            db.delete_ref("default", f"w{i - 2}"); idx.removed([label - 2])
        if i % 5 == 0 and i > 60:
            idx.flush()
        if i == 80:
            print("ready", flush=True)
        i += 1
    """
)


def test_killed_writer_leaves_a_searchable_consistent_index(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)  # mid-update: no flush, maybe mid-save
        proc.wait()
    db = VectorDB(tmp_path / "retrieval" / "vectors.sqlite")
    idx = open_index(tmp_path, db)
    live = set(map(int, db.labels(EMB, "default")))
    assert len(live) > 50
    _, vecs = db.vectors_for_labels(EMB, "default")
    for q in vecs[:20]:
        hits = idx.search(q, 10)
        assert len(hits) == 10 and {lbl for lbl, _ in hits} <= live
        assert hits[0][1] == pytest.approx(1.0, abs=1e-5)  # each live vector finds itself
    db.close()


def test_a_new_vector_database_uses_large_pages_and_an_existing_one_keeps_its_own(tmp_path):
    import sqlite3

    from refsight.retrieval.vectors import VectorDB

    fresh = VectorDB(tmp_path / "new" / "vectors.sqlite")
    assert fresh._conn.execute("PRAGMA page_size").fetchone()[0] == 16384
    fresh.close()
    old_path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(old_path)
    conn.execute("PRAGMA page_size=4096")
    conn.execute("CREATE TABLE keep (x)")
    conn.execute("INSERT INTO keep VALUES (1)")
    conn.commit()
    conn.close()
    old = VectorDB(old_path)  # opens, adds its tables, keeps the page size and the data
    assert old._conn.execute("PRAGMA page_size").fetchone()[0] == 4096
    assert old._conn.execute("SELECT x FROM keep").fetchall() == [(1,)]
    old.close()
