"""The package cache's policies, on a real tiny model: candidates stay in memory, reads never
write, a candidate later added as a reference is made durable, images sent inline are remembered
by the ``remember_images`` policy (one-off ones leave nothing on disk), and scopes isolate tenants."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageOps

from refsight import Engine
from refsight.inputs.images import load_image
from refsight.samples import sample_paths

pytestmark = pytest.mark.slow  # encodes real packages; one test kills a subprocess

MODEL = "tiny-qwen2-vl"
RUBRIC = "short fur\ntriangular ears"


@pytest.fixture
def photos(tmp_path) -> dict[str, Path]:
    paths = sample_paths()
    out = {}
    for name in ("chelsea", "coffee"):
        with Image.open(paths[name]) as image:
            small = image.convert("RGB").resize((56, 56))
        out[name] = tmp_path / f"{name}.png"
        small.save(out[name])
        out[f"{name}-flip"] = tmp_path / f"{name}-flip.png"
        ImageOps.mirror(small).save(out[f"{name}-flip"])
    return out


def _every_byte_of(store: Path) -> bytes:
    """Every file name and every byte under the store, SQLite databases as dumps (WAL included)."""
    chunks = []
    for path in sorted(store.rglob("*")):
        chunks.append(str(path).encode())
        if path.is_file() and path.suffix in (".db", ".sqlite"):
            conn = sqlite3.connect(path)
            chunks.extend(line.encode() for line in conn.iterdump())
            conn.close()
        elif path.is_file():
            chunks.append(path.read_bytes())
    return b"\n".join(chunks)


def test_a_compared_candidate_leaves_nothing_on_disk(tmp_path, photos):
    store = tmp_path / "store"
    with Engine(store, model=MODEL) as engine:
        engine.add(photos["chelsea"], ref_id="cat")
        engine.add(photos["coffee"], ref_id="cup")
        candidate = load_image(photos["chelsea-flip"])
        key = engine.context().package_key(candidate.sha256)
        result = engine.compare(candidate, criteria=RUBRIC, top_k=2)  # recall, attributes and judge all run
        assert len(result.results) == 2 and "attributes" in result.timings_ms
        assert engine.store.memory.contains(key)  # it is cached, in memory
    everything = _every_byte_of(store)
    assert candidate.sha256.encode() not in everything
    assert key.encode() not in everything


def _ask(engine: Engine, reference: Path, candidate: Path, **options):
    """A chat as an unchanged client sends it: the same reference inline, then a candidate, then the question."""
    return engine.chat(["Reference:", load_image(reference), "Candidate:", load_image(candidate), "Same?"],
                       max_new_tokens=2, **options)


def test_an_image_sent_once_leaves_nothing_on_disk_and_one_sent_again_is_remembered(tmp_path, photos):
    store = tmp_path / "store"
    reference, once = load_image(photos["chelsea"]), load_image(photos["coffee-flip"])
    with Engine(store, model=MODEL) as engine:  # the default policy: recurring
        key, once_key = (engine.context().package_key(image.sha256) for image in (reference, once))
        first = _ask(engine, photos["chelsea"], photos["coffee-flip"])
        assert first.references_cached == [False, False] and first.prefix_tokens_reused == 0
        assert not engine.store.local.contains(key) and engine.remembered() == []
        second = _ask(engine, photos["chelsea"], photos["coffee"])  # sent again: kept, from memory (no encode)
        assert second.references_cached == [True, False]
        assert engine.store.local.contains(key) and [i.package_key for i in engine.remembered()] == [key]
        stats = engine.stats()
        assert (stats.remembered, stats.references) == (1, 0) and stats.remembered_bytes == _package_bytes(engine, key)
        assert engine.gc(grace_s=0)["unlinked_packages"] == 0 and engine.store.local.contains(key)  # in use
    everything = _every_byte_of(store)
    assert once.sha256.encode() not in everything and once_key.encode() not in everything  # sent once: nothing
    # A new process (a restart): the remembered image is on disk, and so is the prefix state through it.
    with Engine(store, model=MODEL) as engine:
        after = _ask(engine, photos["chelsea"], photos["chelsea-flip"])
        assert after.references_cached == [True, False] and after.prefix_tokens_reused > 0
        fresh = _ask(engine, photos["chelsea"], photos["chelsea-flip"], use_cache=False)
        assert after.text == fresh.text
        forgotten = engine.forget_remembered()
        assert (len(forgotten.images), forgotten.packages) == (1, 1) and not engine.store.local.contains(key)
        assert engine.remembered() == [] and engine.stats().remembered == 0


def test_an_image_sent_twice_in_one_chat_is_one_encode_and_one_sighting(tmp_path, photos):
    with Engine(tmp_path / "store", model=MODEL) as engine:
        key = engine.context().package_key(load_image(photos["chelsea"]).sha256)
        first = _ask(engine, photos["chelsea"], photos["chelsea"])
        assert first.references_cached == [False, True]  # the repeat takes the first one's package
        assert engine.stats().misses == 1
        assert not engine.store.local.contains(key)  # one sighting: a recurring image is kept once sent again
        again = _ask(engine, photos["chelsea"], photos["chelsea"])
        assert again.references_cached == [True, True] and engine.stats().misses == 1
        assert [i.package_key for i in engine.remembered()] == [key]  # the second request's sighting: kept
        fresh = _ask(engine, photos["chelsea"], photos["chelsea"], use_cache=False)
        assert fresh.references_cached == [False, False] and fresh.text == again.text


def _package_bytes(engine: Engine, key: str) -> int:
    """The bytes of the package stored under ``key``."""
    return engine.store.local.record(key).bytes


@pytest.mark.parametrize("policy", ["off", "all"])
def test_the_remember_images_policy_off_keeps_nothing_and_all_keeps_every_image(tmp_path, photos, policy):
    store = tmp_path / "store"
    with Engine(store, model=MODEL, remember_images=policy) as engine:
        for candidate in ("coffee", "coffee-flip", "chelsea-flip"):
            _ask(engine, photos["chelsea"], photos[candidate])
        kept = {i.package_key for i in engine.remembered()}
        if policy == "off":
            assert kept == set() and engine.store.local.stats()["packages"] == 0
        else:
            assert len(kept) == 4 and engine.stats().remembered == 4
    if policy == "off":
        everything = _every_byte_of(store)
        for name in ("chelsea", "coffee", "coffee-flip", "chelsea-flip"):
            assert load_image(photos[name]).sha256.encode() not in everything


def test_compare_then_add_makes_the_candidate_package_durable(tmp_path, photos):
    store = tmp_path / "store"
    with Engine(store, model=MODEL) as engine:
        engine.add(photos["coffee"], ref_id="cup")
        engine.compare(photos["chelsea"], criteria=RUBRIC, ref_ids=["cup"], attributes=())
        added = engine.add(photos["chelsea"], ref_id="cat")  # failed with AttributeError before the redesign
        assert added.cached is True and added.encode_ms == 0.0
        assert engine.store.local.contains(added.package_key)
        assert engine.reference("cat").packages == {engine.backend().fingerprint().digest: added.package_key}
    # A new process: the package is on disk and serves with zero encodes.
    with Engine(store, model=MODEL) as engine:
        found = engine.reference_package(engine.reference("cat"))
        assert found.cached and engine.verify().ok


def test_reencode_after_compare_makes_the_package_durable(tmp_path, photos):
    store = tmp_path / "store"
    with Engine(store, model="toy") as engine:
        engine.add(photos["chelsea"], ref_id="cat")
        engine.compare(photos["chelsea"], criteria=RUBRIC, ref_ids=["cat"], model=MODEL, attributes=())
        # the reference has no package for MODEL yet, but the candidate lookup left one in memory
        results = list(engine.reencode(model=MODEL))
        assert [r.cached for r in results] == [True]
        assert engine.store.local.contains(results[0].package_key)


def test_cached_reads_issue_no_sql_write(tmp_path, photos):
    store = tmp_path / "store"
    with Engine(store, model=MODEL) as engine:
        engine.add(photos["chelsea"], ref_id="cat")
        engine.generate("Same?", ref_ids=["cat"], max_new_tokens=2)  # warm: links and memory tier
    with Engine(store, model=MODEL) as engine:
        engine.generate("Same?", ref_ids=["cat"], max_new_tokens=2)  # disk hit, promoted to memory
        statements: list[str] = []
        connection = engine.store._db.connection()
        connection.set_trace_callback(statements.append)
        try:
            result = engine.generate("Same?", ref_ids=["cat"], max_new_tokens=2)
        finally:
            connection.set_trace_callback(None)
        assert result.references_cached == [True]
        writes = [s for s in statements if s.split()[0].upper() in ("INSERT", "UPDATE", "DELETE", "REPLACE")]
        assert not writes and not any("IMMEDIATE" in s.upper() for s in statements), statements
        pending = engine.store.counters.pending()
        assert pending["hits"] >= 2
    # Counted in memory, flushed on close: they survive the restart.
    with Engine(store, model=MODEL) as engine:
        stats = engine.stats()
        assert stats.hits >= 2 and stats.misses == 1


def test_counters_lost_to_a_sigkill_are_bounded(tmp_path, photos):
    """A process killed before any flush loses only its own last interval's counts, nothing else."""
    store = tmp_path / "store"
    with Engine(store, model="toy") as engine:
        engine.add(photos["chelsea"], ref_id="cat")
    script = (
        "import os, signal, sys\n"
        "from refsight import Engine\n"
        f"engine = Engine({str(store)!r}, model='toy')\n"
        "engine.generate('x', ref_ids=['cat'], max_new_tokens=1)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=False, timeout=120)
    with Engine(store, model="toy") as engine:
        stats = engine.stats()
        assert stats.references == 1 and stats.misses == 1  # the add's count, flushed on close
        assert engine.verify().ok


def _field_shape(reply: dict) -> dict:
    """A chat/compare reply with timing values replaced by whether they are zero."""
    out = dict(reply)
    out["timings_ms"] = {k: v > 0 for k, v in reply["timings_ms"].items()}
    return out


def test_tenants_isolated_by_scope_learn_nothing_of_each_other(tmp_path, photos):
    store = tmp_path / "store"
    with Engine(store, model=MODEL, share_packages=False) as engine:
        a = engine.add(photos["chelsea"], ref_id="cat", namespace="tenant-a")
        engine.compare(photos["coffee"], criteria=RUBRIC, ref_ids=["cat"], namespace="tenant-a", attributes=())
        # Tenant B sends the same two images: the reference A stored, and A's compared candidate.
        b = engine.add(photos["chelsea"], ref_id="mine", namespace="tenant-b")
        assert (b.cached, b.encode_ms > 0) == (False, True) and b.package_key != a.package_key
        cold = engine.chat(["look", load_image(photos["coffee-flip"])], namespace="tenant-b", max_new_tokens=2)
        seen_by_a = engine.chat(["look", load_image(photos["coffee"])], namespace="tenant-b", max_new_tokens=2)
        assert _field_shape(seen_by_a.to_dict())["timings_ms"] == _field_shape(cold.to_dict())["timings_ms"]
        assert seen_by_a.references_cached == cold.references_cached == [False]
        assert seen_by_a.timings_ms["encode"] > 0
    # Sharing is the explicit alternative: then B hits A's package.
    with Engine(store, model=MODEL, share_packages=True) as engine:
        shared_a = engine.add(photos["coffee"], ref_id="cup", namespace="tenant-a")
        shared_b = engine.add(photos["coffee"], ref_id="cup", namespace="tenant-b")
        assert shared_a.package_key == shared_b.package_key and shared_b.cached
