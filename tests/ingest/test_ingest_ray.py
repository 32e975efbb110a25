"""``refsight ingest --ray local`` on a local Ray instance: 300 generated images plus the bad-image corpus,
an actor killed mid-job, and a re-run that encodes nothing.

Each ingest is the CLI in a child process, as a user runs it. Ray's driver, started in the test process,
left native threads running after ``ray.shutdown()`` and replaced Python's fault handler: a later, unrelated
test then died of a segmentation fault with no traceback (CI, stops 54 and 55, about one run in eight).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from runtimes import require_module

from hardening_helpers import run_bounded
from image_corpus import CORPUS_ACCEPTED, CORPUS_REJECTED
from ingest_helpers import MODEL, make_images, snapshot, stored_packages
from refsight import Engine

ray = require_module("ray", "pip install 'refsight[ray]'")
pytestmark = pytest.mark.slow  # three 300-image ingests, each on a local Ray instance of its own

COUNT = 300


def ingest(store: Path, source: Path, *, batch_size: int, errors: Path | None = None) -> dict:
    """``refsight ingest SOURCE --ray local --actors 2`` in a child process: its JSON report (it exits 1: the
    bad-image corpus is refused)."""
    run = run_bounded(["--store", str(store), "ingest", str(source), "--model", MODEL, "--ray", "local", "--actors", "2",
                       "--batch-size", str(batch_size), "--json", "--errors", str(errors or store.parent / "errors.jsonl")],
                      timeout=900)
    assert run.returncode == 1 and run.stdout.strip(), run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A text file naming 300 generated images and every file of the bad-image corpus."""
    from image_corpus import build_bad_image_corpus

    root = tmp_path_factory.mktemp("ray-source")
    paths = make_images(root / "images", COUNT) + list(build_bad_image_corpus(root / "corpus").values())
    listing = root / "paths.txt"
    listing.write_text("\n".join(str(p) for p in paths) + "\n")
    return listing


@pytest.fixture(scope="module")
def undisturbed(source, tmp_path_factory):
    """The reference run: its store, report and snapshot."""
    store = tmp_path_factory.mktemp("undisturbed") / "store"
    report = ingest(store, source, batch_size=8)
    return store, report, snapshot(store)


def test_every_good_image_is_stored_exactly_once_and_the_bad_ones_are_reported(undisturbed):
    store, report, held = undisturbed
    good = COUNT + len(CORPUS_ACCEPTED)
    counts = [report[name] for name in ("images", "added", "cached", "failed", "actors", "mode", "vectors", "records")]
    assert counts == [good + len(CORPUS_REJECTED), good, 0, len(CORPUS_REJECTED), 2, "ray", good, good]
    errors = (store.parent / "errors.jsonl").read_text()
    assert all(f"{name}." in errors for name in CORPUS_REJECTED) and errors.count("\n") == len(CORPUS_REJECTED)
    shas = [sha for _, _, sha, _ in held["references"]]
    assert len(shas) == len(set(shas)) == good  # each exactly once
    assert sorted(sha for _, sha in held["packages"]) == sorted(shas)
    assert sorted(sha for _, sha in held["vectors"]) == sorted(shas)
    assert sorted(sha for sha, _, _ in held["records"]) == sorted(shas)
    assert len(held["links"]) == len(held["entries"]) == len(held["images"]) == good
    # Nothing written for the bad files: one kept image and one package file per good image.
    assert sum(p.is_file() for p in (store / "images").rglob("*")) == good
    assert sum(1 for _ in (store / "packages").rglob("*.safetensors")) == good


def test_a_rerun_encodes_nothing(undisturbed, source):
    store, _, held = undisturbed
    report = ingest(store, source, batch_size=8, errors=store.parent / "rerun-errors.jsonl")
    assert [report[name] for name in ("added", "vectors", "records", "encode_s")] == [0, 0, 0, 0.0]
    assert report["cached"] == COUNT + len(CORPUS_ACCEPTED)
    assert snapshot(store) == held


def _encoder_actors() -> list[int]:
    """Pids of the live encode actors (Ray titles them ``ray::MapWorker(MapBatches(EncodeStage))``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                title = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"MapBatches(EncodeStage)" in title:
                pids.append(int(entry.name))
    return pids


def test_an_actor_killed_mid_job_is_retried_and_the_store_matches_an_undisturbed_run(undisturbed, source, tmp_path):
    _, _, expected = undisturbed
    store = tmp_path / "store"
    killed: list[tuple[int, int]] = []
    done = threading.Event()

    def killer() -> None:
        # SIGKILL one encode actor once a tenth of the packages are written: mid-job, batches in flight.
        while not done.is_set():
            written = stored_packages(store)
            actors = _encoder_actors()
            if written >= COUNT // 10 and actors:
                os.kill(actors[0], signal.SIGKILL)
                killed.append((actors[0], written))
                return
            time.sleep(0.05)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        report = ingest(store, source, batch_size=4)
    finally:
        done.set()
        thread.join()
    assert killed and killed[0][1] < COUNT, "the actor was not killed while the job ran"
    with Engine(store, model=MODEL) as engine:
        assert engine.verify().ok
    assert report["failed"] == len(CORPUS_REJECTED) and report["added"] + report["cached"] == COUNT + len(CORPUS_ACCEPTED)
    assert snapshot(store) == expected  # same keys, same references, vectors and records
