"""The float32 copy beside the graph: exact rows by label, append-only, crash- and process-safe."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from refsight.retrieval.exact_copy import LABELS_FILE, ROWS_FILE, ExactCopy
from refsight.retrieval.index import VectorIndex
from refsight.retrieval.vectors import VectorDB

DIM = 16


def rows(labels, seed=0) -> np.ndarray:
    """A distinct, reproducible vector per label."""
    return np.stack([np.random.default_rng(int(label) + 1000 * seed).standard_normal(DIM) for label in labels]).astype(np.float32)


def assert_holds(copy: ExactCopy, labels) -> None:
    found, vectors, lacking = copy.get(np.asarray(labels))
    assert sorted(found) == sorted(labels) and len(lacking) == 0
    np.testing.assert_array_equal(vectors, rows(found))


def test_rows_come_back_by_label_before_and_after_a_flush_and_a_reopen(tmp_path):
    copy = ExactCopy(tmp_path, DIM)
    copy.append(np.array([5, 2, 9]), rows([5, 2, 9]))
    assert copy.dirty and not (tmp_path / ROWS_FILE).exists()
    assert_holds(copy, [9, 5])  # answered from the queue
    copy.flush()
    assert not copy.dirty and (tmp_path / ROWS_FILE).stat().st_size == 3 * DIM * 4
    reopened = ExactCopy(tmp_path, DIM)
    assert_holds(reopened, [2, 5, 9])
    found, _, lacking = reopened.get(np.array([2, 3, 100]))
    assert list(found) == [2] and list(lacking) == [3, 100]
    assert list(reopened.held()) == [2, 5, 9]


def test_labels_held_already_are_not_written_twice(tmp_path):
    a, b = ExactCopy(tmp_path, DIM), ExactCopy(tmp_path, DIM)
    a.append(np.array([1, 2]), rows([1, 2]))
    a.flush()
    b.append(np.array([2, 3]), rows([2, 3]))  # b has not seen a's rows: it queues both
    b.flush()  # ... and writes only 3, which is not in the files yet
    assert ExactCopy(tmp_path, DIM).rows_written == 3
    a.refresh()  # a picks up b's row
    assert_holds(a, [1, 2, 3])


def test_a_torn_tail_is_ignored_and_cut_before_the_next_append(tmp_path):
    copy = ExactCopy(tmp_path, DIM)
    copy.append(np.array([1, 2]), rows([1, 2]))
    copy.flush()
    # a crash mid-append: one and a half rows written, their labels never
    with open(tmp_path / ROWS_FILE, "ab") as f:
        f.write(rows([7, 8]).tobytes()[: DIM * 4 * 3 // 2])
    reopened = ExactCopy(tmp_path, DIM)
    assert reopened.rows_written == 2
    reopened.append(np.array([3]), rows([3]))
    reopened.flush()
    assert (tmp_path / ROWS_FILE).stat().st_size == 3 * DIM * 4
    assert_holds(ExactCopy(tmp_path, DIM), [1, 2, 3])


def test_labels_without_their_rows_are_not_trusted(tmp_path):
    copy = ExactCopy(tmp_path, DIM)
    copy.append(np.array([1, 2, 3]), rows([1, 2, 3]))
    copy.flush()
    with open(tmp_path / ROWS_FILE, "r+b") as f:  # rows lost after their labels were written
        f.truncate(DIM * 4)
    assert_holds(ExactCopy(tmp_path, DIM), [1])
    assert list(ExactCopy(tmp_path, DIM).get(np.array([2, 3]))[2]) == [2, 3]


def test_a_rewrite_interrupted_after_dropping_the_labels_reads_as_empty(tmp_path):
    copy = ExactCopy(tmp_path, DIM)
    copy.append(np.array([1, 2]), rows([1, 2]))
    copy.flush()
    (tmp_path / LABELS_FILE).unlink()  # what replace() does first
    (tmp_path / ROWS_FILE).write_bytes(rows([40, 41, 42], seed=1).tobytes())  # new rows, no labels yet
    reopened = ExactCopy(tmp_path, DIM)
    assert reopened.rows_written == 0 and len(reopened.get(np.array([1, 2]))[2]) == 2
    reopened.append(np.array([4]), rows([4]))
    reopened.flush()  # the orphaned rows are cut, so 4's row is the first
    assert_holds(ExactCopy(tmp_path, DIM), [4])


def test_a_reader_keeps_its_rows_while_another_process_rewrites_the_copy(tmp_path):
    reader, writer = ExactCopy(tmp_path, DIM), ExactCopy(tmp_path, DIM)
    writer.append(np.arange(1, 51), rows(range(1, 51)))
    writer.flush()
    reader.refresh()
    writer.replace(np.arange(100, 110), rows(range(100, 110)))
    assert_holds(reader, list(range(1, 51)))  # still mapped: the old file, whole
    reader.refresh()
    assert_holds(reader, list(range(100, 110)))
    assert list(reader.get(np.array([1]))[2]) == [1]
    writer.clear()
    reader.refresh()
    assert reader.rows_written == 0 and not (tmp_path / ROWS_FILE).exists()


# -- inside the index -----------------------------------------------------------------------

EMB = "copydigest"


@pytest.fixture
def filled(tmp_path):
    db = VectorDB(tmp_path / "retrieval" / "vectors.sqlite")
    rng = np.random.default_rng(3)
    vecs = rng.standard_normal((200, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    db.put_vectors(EMB, {f"s{i}": v for i, v in enumerate(vecs)})
    labels = [db.upsert_entry(EMB, "default", f"r{i}", f"s{i}", {})[0] for i in range(len(vecs))]
    yield db, vecs, np.array(labels)
    db.close()


def open_index(tmp_path, db) -> VectorIndex:
    return VectorIndex(tmp_path / "retrieval", db, EMB, "default", DIM, exact_threshold=50)


def traced(db: VectorDB) -> list[str]:
    statements: list[str] = []
    db._conn.set_trace_callback(statements.append)
    return statements


def test_searches_rescore_from_the_copy_not_the_database(tmp_path, filled):
    db, vecs, labels = filled
    idx = open_index(tmp_path, db)
    idx.search(vecs[0], 1)  # open: builds the graph and the copy
    sql = traced(db)
    hits = idx.search(vecs[7], 5)
    assert hits[0] == (labels[7], pytest.approx(1.0, abs=1e-6))
    for label, score in hits:  # exact float32 scores
        assert score == pytest.approx(float(vecs[labels.tolist().index(label)] @ vecs[7]), abs=1e-6)
    assert not any("embeddings" in s for s in sql)  # no float32 row came from SQLite


def test_a_lost_copy_falls_back_to_the_database_and_is_refilled_on_open(tmp_path, filled):
    db, vecs, labels = filled
    idx = open_index(tmp_path, db)
    want = idx.search(vecs[3], 10)
    idx.flush()
    folder = tmp_path / "retrieval" / EMB / "default"
    (folder / LABELS_FILE).unlink()
    idx._copy.refresh()  # the running index notices the loss
    assert idx.search(vecs[3], 10) == want
    reopened = open_index(tmp_path, db)
    assert reopened.search(vecs[3], 10) == want and not reopened.rebuilt
    reopened.flush()
    assert ExactCopy(folder, DIM).rows_written == len(labels)


def test_rows_of_removed_references_are_never_returned(tmp_path, filled):
    db, vecs, labels = filled
    idx = open_index(tmp_path, db)
    idx.search(vecs[0], 1)
    idx.flush()
    db.delete_ref("default", "r9")  # another process: neither the graph nor the copy is told
    assert idx._copy.get(labels[9:10])[0].tolist() == [labels[9]]
    hits = idx.search(vecs[9], 10)
    assert len(hits) == 10 and labels[9] not in {lbl for lbl, _ in hits}


def test_references_added_by_another_process_are_scored_exactly(tmp_path, filled):
    db, vecs, labels = filled
    idx = open_index(tmp_path, db)
    idx.search(vecs[0], 1)
    other = sqlite3.connect(db.path)  # a second writer, outside this index
    v = -vecs[0]
    other.execute("INSERT INTO embeddings VALUES (?,?,?,?)", (EMB, "new", DIM, v.astype(np.float32).tobytes()))
    other.execute("INSERT INTO entries (embedder, namespace, ref_id, image_sha256) VALUES (?,?,?,?)", (EMB, "default", "new", "new"))
    other.commit()
    other.close()
    top = idx.search(v, 1)[0]
    assert top[0] > labels.max() and top[1] == pytest.approx(1.0, abs=1e-6)


def test_a_copy_of_mostly_removed_rows_is_rewritten_on_open(tmp_path, filled, monkeypatch):
    from refsight.retrieval import index as index_mod

    db, vecs, labels = filled
    idx = open_index(tmp_path, db)
    idx.search(vecs[0], 1)
    idx.flush()
    for i in range(150):
        db.delete_ref("default", f"r{i}")
    monkeypatch.setattr(index_mod, "COPY_SLACK_ROWS", 0)
    reopened = open_index(tmp_path, db)
    assert reopened.search(vecs[199], 1)[0][0] == labels[199]
    assert reopened._copy.rows_written == 50
    assert list(reopened._copy.held()) == list(labels[150:])
