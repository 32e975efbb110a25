"""The store lifecycle through the engine and the CLI: the byte quota (LRU order, never under a
running request, references and kept images never evicted), prune, and the [store] settings.

The toy encoder is enough: these tests are about which packages stay on disk and which are
re-encoded, not about model paths (those are proven in tests/backends).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from refsight import Engine
from refsight.backends.registry import register_backend
from refsight.backends.toy import ToyBackend
from refsight.cli import main
from refsight.errors import InvalidInputError
from refsight.settings import load_settings

def _key(engine: Engine, ref_id: str, model: str | None = None) -> str:
    ref = engine.reference(ref_id)
    return engine.context(model=model).package_key(ref.image_sha256)


def _on_disk(engine: Engine, ref_id: str, model: str | None = None) -> bool:
    return engine.store.local.contains(_key(engine, ref_id, model))


def _package_bytes(tmp_path: Path, photo_files: dict[str, Path]) -> int:
    """The largest package file of these photos under the toy encoder (sizes differ by a few header bytes)."""
    with Engine(tmp_path / "probe", model="toy") as engine:
        list(engine.add_many(list(photo_files.values())))
        return max(r.bytes for r in engine.store.local.records())


def test_the_quota_evicts_least_recently_used_first_and_never_references(tmp_path, photo_files):
    size = _package_bytes(tmp_path, photo_files)
    store = tmp_path / "store"
    with Engine(store, model="toy", memory_bytes=0, max_package_bytes=3 * size + size // 2) as engine:
        for name in ("chelsea", "coffee", "rocket"):
            engine.add(photo_files[name])
            time.sleep(0.01)
        original = engine.reference_package(engine.reference("coffee")).package.tensors["features"].clone()
        time.sleep(0.01)
        engine.reference_package(engine.reference("chelsea"))  # used: now younger than coffee and rocket
        time.sleep(0.01)
        engine.add(photo_files["astronaut"])  # a 4th package: one must go, the least recently used
        assert [_on_disk(engine, n) for n in ("chelsea", "coffee", "rocket", "astronaut")] == [True, True, False, True]
        stats = engine.stats()
        assert stats.quota_evictions == 1 and stats.packages == 3 and stats.bytes <= 3 * size + size // 2
        assert stats.max_package_bytes == 3 * size + size // 2 and stats.references == 4
        # the reference, its metadata and its kept image stay; its package is re-encoded on next use
        rocket = engine.reference("rocket")
        assert engine.reference_image(rocket).sha256 == rocket.image_sha256
        misses = engine.stats().misses
        found = engine.reference_package(rocket)
        assert found.cached is False and engine.stats().misses == misses + 1
        assert _on_disk(engine, "rocket")
        # ... which evicted the next least recently used: coffee (chelsea was used after it)
        assert not _on_disk(engine, "coffee") and _on_disk(engine, "chelsea")
        again = engine.reference_package(engine.reference("coffee"))
        assert again.cached is False and again.package.tensors["features"].equal(original)


class BlockingToy(ToyBackend):
    """Toy encodes; ``generate`` waits until released (a request that holds its packages a while)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.entered = threading.Event()
        self.release = threading.Event()

    def generate(self, requests, *, return_logits=False):
        self.entered.set()
        assert self.release.wait(30)
        return super().generate(requests, return_logits=return_logits)


def test_the_quota_never_evicts_what_a_running_request_holds(tmp_path, photo_files, backend_registry):
    backend = BlockingToy("toy-blocking")
    register_backend("toy-blocking", lambda name: backend)
    with Engine(tmp_path / "store", model="toy-blocking", memory_bytes=0, max_package_bytes=1) as engine:
        engine.add(photo_files["chelsea"])  # alone over a 1-byte quota: nothing else to evict, it stays
        held = _key(engine, "chelsea")
        answers: list = []
        worker = threading.Thread(target=lambda: answers.append(engine.generate("describe", ref_ids=["chelsea"])))
        worker.start()
        assert backend.entered.wait(30)  # the request holds chelsea's package now
        engine.add(photo_files["coffee"])  # over quota: everything idle goes, the held package stays
        assert engine.store.local.contains(held) and held in engine.store.pins
        assert engine.stats().quota_evictions == 0
        backend.release.set()
        worker.join(30)
        assert answers and answers[0].references_cached == [True]
        assert held not in engine.store.pins
        engine.add(photo_files["rocket"])  # released: now chelsea (and coffee) may go
        assert not engine.store.local.contains(held) and not _on_disk(engine, "coffee")
        assert engine.stats().quota_evictions == 2 and _on_disk(engine, "rocket")


def test_prune_drops_a_models_packages_and_keeps_the_references(tmp_path, photo_files, backend_registry, capsys):
    register_backend("toy-grid4", lambda name: ToyBackend(name, grid=4))
    store = tmp_path / "store"
    with Engine(store, model="toy", memory_bytes=0) as engine:
        list(engine.add_many([photo_files[n] for n in ("chelsea", "coffee", "rocket")]))
        assert all(not r.cached for r in engine.reencode(model="toy-grid4"))
        listing = engine.prune()  # nothing named: the fingerprints, nothing removed
        assert listing.dry_run and {f["model_id"] for f in listing.fingerprints} == {"toy", "toy-grid4"}
        dry = engine.prune(models=["toy-grid4"], dry_run=True)
        assert dry.packages == 3 and dry.links == 0 and all(_on_disk(engine, n, "toy-grid4") for n in ("chelsea", "coffee"))
        grid4 = engine.backend("toy-grid4").fingerprint().digest
        refs_before = [(r.ref_id, r.image_sha256, r.metadata) for r in engine.references()]
    code = main(["prune", "--model", "toy-grid4", "--store", str(store), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["packages"] == 3 and report["links"] == 3 and report["dry_run"] is False
    with Engine(store, model="toy", memory_bytes=0) as engine:
        assert [(r.ref_id, r.image_sha256, r.metadata) for r in engine.references()] == refs_before
        assert all(set(r.packages) == {engine.backend().fingerprint().digest} for r in engine.references())
        assert engine.stats().packages == 3 and engine.stats().pruned == 3
        assert engine.reference_package(engine.reference("chelsea")).cached is True  # toy untouched
        # the next use under the pruned model encodes again, from the kept image
        found = engine.reference_package(engine.reference("coffee"), model="toy-grid4")
        assert found.cached is False and engine.reference("coffee").packages[grid4] == found.package.key
        by_digest = engine.prune(fingerprints=[grid4])
        assert by_digest.packages == 1 and by_digest.links == 1
    assert main(["prune", "--fingerprint", "xyz", "--store", str(store)]) == 1
    assert "fingerprint" in capsys.readouterr().err


def test_quota_and_cache_come_from_the_config_file_and_flags_win(tmp_path, photo_files, capsys):
    store = tmp_path / "store"
    store.mkdir()
    (store / "refsight.toml").write_text('[store]\nmax_package_bytes = "1B"\nmemory_bytes = 0\n')
    for name in ("chelsea", "coffee"):
        assert main(["add", str(photo_files[name]), "--store", str(store), "--model", "toy", "--attributes", "none"]) == 0
    assert main(["stats", "--store", str(store), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert stats["max_package_bytes"] == 1 and stats["quota_evictions"] == 1 and stats["packages"] == 1
    assert stats["tiers"]["memory"]["max_bytes"] == 0 and set(stats["tiers"]) == {"memory", "disk"}
    assert main(["stats", "--store", str(store), "--json", "--max-package-bytes", "2MiB"]) == 0
    assert json.loads(capsys.readouterr().out)["max_package_bytes"] == 2 * 1024 * 1024
    assert main(["stats", "--store", str(store), "--max-package-bytes", "lots"]) == 1
    assert "max_package_bytes" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, problem",
    [
        ('[store]\nmax_package_bytes = "12 parsecs"\n', "unknown unit"),
        ("[store]\nmax_package_bytes = 0\n", "at least 1"),
        ('[store]\nquota = "1GB"\n', "unknown key"),
        ("[store]\nredis = 6379\n", "redis:// URL"),
    ],
)
def test_bad_store_settings_name_the_file_and_key(tmp_path, text, problem):
    (tmp_path / "refsight.toml").write_text(text)
    with pytest.raises(InvalidInputError, match=problem) as info:
        load_settings(tmp_path)
    assert "refsight.toml" in str(info.value) and "[store]" in str(info.value)


def test_sizes_in_the_config_file(tmp_path):
    (tmp_path / "refsight.toml").write_text('[store]\nmax_package_bytes = "20GiB"\nmemory_bytes = "512MB"\n')
    settings = load_settings(tmp_path)
    assert settings.store.max_package_bytes == 20 * 1024**3 and settings.store.memory_bytes == 512 * 10**6
    assert settings.store_options(max_package_bytes=5) == {"memory_bytes": 512 * 10**6, "max_package_bytes": 5}
