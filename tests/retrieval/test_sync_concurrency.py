"""Issue 25 item 5: whatever the interleaving of writers, every process's index converges to the catalog.

Two races lost references for good: a process's own new label advanced its index past a lower
label another process had committed meanwhile, and a removal listener running late dropped an
id another process had re-added (and indexed) since. Each has a deterministic test below.

Several real processes (each with two threads) add, re-describe and remove references from one pool
of ids on one store, searching between writes; afterwards one search in each process must return
exactly what the catalog lists. On SQLite the processes share the store and its retrieval database;
on PostgreSQL each is a replica with its own retrieval database, following the shared journal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sync_workers import DIM, NAMESPACE, HashEmbedder, everything, image_bytes

from refsight.inputs.images import load_image
from refsight.retrieval import Retriever
from refsight.retrieval.store_index import StoreIndex

pytestmark = pytest.mark.slow  # several writer processes per test

WORKER = Path(__file__).with_name("sync_workers.py")
PROCESSES = 3
ROUNDS = 40


def _start(root: Path, catalog: str, local: Path | None, seed: int) -> subprocess.Popen:
    argv = [sys.executable, str(WORKER), str(root), catalog, str(local or ""), str(seed), str(ROUNDS), "2"]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _say(proc: subprocess.Popen, word: str) -> None:
    proc.stdin.write(word + "\n")
    proc.stdin.flush()


def _expect(proc: subprocess.Popen, word: str) -> None:
    line = proc.stdout.readline().strip()
    if line != word:
        proc.kill()
        raise AssertionError(f"worker said {line!r}, not {word!r}: {proc.stderr.read()}")


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_concurrent_adds_and_removes_from_several_processes_leave_every_index_equal_to_the_catalog(
    kind, tmp_path, request
):
    catalog = request.getfixturevalue("postgres") if kind == "postgresql" else ""
    root = tmp_path / "store"
    # Replicas on PostgreSQL keep derived data apart; on SQLite every process shares the store's.
    locals_ = [tmp_path / f"replica-{n}" if catalog else None for n in range(PROCESSES)]
    procs = [_start(root, catalog, locals_[n], seed=n + 1) for n in range(PROCESSES)]
    try:
        for proc in procs:  # barrier: every worker is connected and indexed before any writes
            _expect(proc, "READY")
        for proc in procs:
            _say(proc, "go")
        for proc in procs:
            _expect(proc, "DONE")
        for proc in procs:
            _say(proc, "check")
        answers = [json.loads(proc.stdout.readline()) for proc in procs]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
    finally:
        for proc in procs:
            proc.kill()
    listed = answers[0]["listed"]
    assert all(answer["listed"] == listed for answer in answers)
    assert listed, "the writers left no reference at all: the test proves nothing"
    for n, answer in enumerate(answers):
        missing = sorted(set(listed) - set(answer["searched"]))
        extra = sorted(set(answer["searched"]) - set(listed))
        assert (missing, extra) == ([], []), f"process {n}: search misses {missing}, returns removed {extra}"


def _unit(n: int) -> np.ndarray:
    vector = np.zeros(DIM, np.float32)
    vector[n] = 1.0
    return vector


@pytest.mark.parametrize("mode", ["exact", "ann"])
def test_a_label_another_process_committed_just_before_ours_is_never_skipped(tmp_path, mode):
    """The race behind item 5: this process's own new label must not hide a lower one committed elsewhere."""
    threshold = 1 if mode == "ann" else 10_000
    here = Retriever(tmp_path, HashEmbedder(), exact_threshold=threshold)
    there = Retriever(tmp_path, HashEmbedder(), exact_threshold=threshold)  # its own connection: another process
    try:
        here.db.put_vectors(here.embedder.digest, {f"sha-{n}": _unit(i) for i, n in enumerate("abc")})
        here.add_vector("a", "sha-a", _unit(0))
        assert [ref for ref, _ in here.search_vector(_unit(0), 5)] == ["a"]  # this index has read label 1
        assert here._index("default").mode == mode
        there.add_vector("b", "sha-b", _unit(1))  # label 2, committed by "another process"
        here.add_vector("c", "sha-c", _unit(2))  # label 3, this process's own
        assert sorted(ref for ref, _ in here.search_vector(np.ones(DIM, np.float32), 5)) == ["a", "b", "c"]
    finally:
        here.close()
        there.close()


def test_a_late_removal_listener_never_drops_an_id_re_added_since(tmp_path):
    """``forget`` of a removal that another process has since undone (re-added the id) leaves the new entry."""
    from refsight.store import open_store

    with open_store(tmp_path / "store") as store:
        data, image = image_bytes(1), load_image(image_bytes(1))
        index = StoreIndex(store.derived_root, store.catalog, lambda row: image, embedder=HashEmbedder())
        try:
            store.catalog.ingest_reference("x", image.sha256, data, "PNG", {}, namespace=NAMESPACE)
            assert everything(index) == ["x"]
            store.catalog.remove_reference("x", namespace=NAMESPACE)  # this process's removal ...
            store.catalog.ingest_reference("x", image.sha256, data, "PNG", {"again": True}, namespace=NAMESPACE)
            assert everything(index) == ["x"]  # ... another process re-added it and synced
            index.forget(NAMESPACE, "x")  # ... and this process's listener runs only now
            assert everything(index) == ["x"]
            store.catalog.remove_reference("x", namespace=NAMESPACE)
            index.forget(NAMESPACE, "x")
            assert everything(index) == []
        finally:
            index.close()
