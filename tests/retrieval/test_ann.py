"""The hnswlib graph wrapper: exact scores, deletion marks counted, slots reused, safe loads."""

from __future__ import annotations

import numpy as np
import pytest

from refsight.retrieval.ann import AnnIndex

DIM = 24


def unit(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_scores_are_exact_inner_products_best_first():
    vecs = unit(200, 0)
    ann = AnnIndex(DIM)
    ann.add(np.arange(1, 201), vecs)
    labels, scores = ann.search(vecs[9], 5)
    assert labels[0] == 10 and list(scores) == sorted(scores, reverse=True)
    np.testing.assert_allclose(scores, vecs[labels - 1] @ vecs[9], atol=1e-5)


def test_removed_labels_are_never_returned_and_their_slots_are_reused():
    vecs = unit(300, 1)
    ann = AnnIndex(DIM, capacity=300)
    ann.add(np.arange(1, 301), vecs)
    ann.remove(np.arange(1, 101))
    ann.remove(np.array([5, 10_000]))  # deleted already, never held: both ignored
    assert len(ann) == 200
    for q in vecs[:20]:
        assert (ann.search(q, 10)[0] > 100).all()
    ann.add(np.arange(301, 351), unit(50, 2))  # fills deleted slots: no growth
    assert len(ann) == 250 and ann._index.max_elements == 300 and ann._index.element_count == 300
    assert ann.search(unit(50, 2)[7], 1)[0][0] == 308


def test_capacity_grows_as_labels_arrive():
    ann = AnnIndex(DIM, capacity=4)
    for start in range(0, 3000, 500):
        ann.add(np.arange(start + 1, start + 501), unit(500, start))
    assert len(ann) == 3000 and ann._index.max_elements >= 3000


def test_a_loaded_graph_counts_its_deleted_slots_after_retain(tmp_path):
    vecs = unit(120, 3)
    ann = AnnIndex(DIM)
    ann.add(np.arange(1, 121), vecs)
    ann.remove(np.arange(1, 21))
    ann.save(tmp_path / "g.bin")
    loaded = AnnIndex.load(tmp_path / "g.bin", DIM)
    live = np.arange(21, 131)  # 121..130 were added to the database after the save
    missing, marked = loaded.retain(np.setdiff1d(live, [50]))  # and 50 was removed
    assert list(missing) == list(range(121, 131))
    assert marked == 1  # 1..20 were marked in the file already
    assert len(loaded) == 99
    assert 50 not in loaded.search(vecs[49], 10)[0]


def test_search_asks_for_no_more_than_is_live():
    ann = AnnIndex(DIM)
    ann.add(np.arange(1, 11), unit(10, 4))
    ann.remove(np.arange(1, 8))
    labels, _ = ann.search(unit(1, 5)[0], 10)
    assert sorted(labels) == [8, 9, 10]
    ann.remove(np.array([8, 9, 10]))
    assert len(ann.search(unit(1, 5)[0], 10)[0]) == 0


@pytest.mark.parametrize("damage", ["short", "other-dim", "garbage"])
def test_unreadable_or_foreign_files_raise_instead_of_loading(tmp_path, damage):
    ann = AnnIndex(DIM)
    ann.add(np.arange(1, 51), unit(50, 6))
    path = tmp_path / "g.bin"
    ann.save(path)
    if damage == "short":
        path.write_bytes(path.read_bytes()[:40])
    elif damage == "garbage":
        path.write_bytes(path.read_bytes()[:48] + bytes(range(256)) * 64)
    with pytest.raises((ValueError, RuntimeError)):
        AnnIndex.load(path, DIM * 2 if damage == "other-dim" else DIM)


def _run_together(*functions) -> list[BaseException]:
    """Run ``functions`` in threads at once; what any of them raised."""
    import threading

    errors: list[BaseException] = []

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - any failure in a thread fails the test
                errors.append(exc)
        return run

    threads = [threading.Thread(target=guarded(f)) for f in functions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_searches_adds_and_removals_from_many_threads_leave_a_consistent_graph():
    vecs = unit(2000, 7)
    ann = AnnIndex(DIM, capacity=16)  # small: adds must resize while others search
    ann.add(np.arange(1, 201), vecs[:200])

    def adder():
        for start in range(200, 2000, 100):
            ann.add(np.arange(start + 1, start + 101), vecs[start : start + 100])

    def remover():
        for label in range(1, 200, 2):
            ann.remove(np.array([label]))

    def searcher():
        for q in vecs[:300]:
            _, scores = ann.search(q, 5)
            assert list(scores) == sorted(scores, reverse=True)

    assert not _run_together(adder, remover, searcher, searcher)
    assert len(ann) == 2000 - 100
    removed = set(range(1, 200, 2))
    for q in vecs[200:260]:
        assert not removed & set(ann.search(q, 10)[0].tolist())
