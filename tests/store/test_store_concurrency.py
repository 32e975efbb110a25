"""Two processes adding the same and different packages and references at once corrupt nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from store_helpers import fingerprint, image_hash, make_package

from refsight.store import open_store

pytestmark = pytest.mark.slow  # several writer processes per test

WORKER = Path(__file__).with_name("store_workers.py")
ROUNDS = 12


def test_two_processes_writing_at_once(tmp_path):
    root = tmp_path / "store"
    open_store(root).close()  # both workers race on an existing store; creation is tested below
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), "concurrent", str(root), str(w), str(ROUNDS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(2)
    ]
    for proc in procs:  # barrier: both are imported and connected before either writes
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.strip() == "DONE"

    fp = fingerprint()
    with open_store(root) as store:
        assert dict(store.local.verify_all()) == {k: None for k in store.local.keys()}
        # ROUNDS shared packages + ROUNDS private ones per worker, each stored once
        assert store.local.stats()["packages"] == 3 * ROUNDS
        refs = {r.ref_id: r for r in store.catalog.list_references()}
        assert len(refs) == 3 * ROUNDS
        for i in range(ROUNDS):
            shared = refs[f"shared-{i}"]
            assert shared.packages == {fp.digest: make_package(i).key}
            assert store.catalog.get_image(image_hash(i)) == f"bytes of image {i}".encode()
            for w in range(2):
                n = 1000 * (w + 1) + i
                assert refs[f"w{w}-{i}"].packages == {fp.digest: make_package(n).key}
                assert store.local.get(make_package(n).key) is not None
        counters = store.catalog.counters()
        # every bump from both processes counted: 2 per round per worker
        assert counters["hits"] == 2 * 2 * ROUNDS
        assert counters["encode_ms_saved"] == 2.5 * 2 * 2 * ROUNDS
        leftovers = [p for p in root.rglob(".tmp-*")]
        assert leftovers == []


def test_two_processes_creating_one_store_at_once(tmp_path):
    root = tmp_path / "fresh"
    code = (
        "import sys; from refsight.store import open_store; "
        "s = open_store(sys.argv[1]); s.catalog.bump(misses=1); s.close()"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(root)], stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    with open_store(root) as store:
        assert store.catalog.counters()["misses"] == 3
