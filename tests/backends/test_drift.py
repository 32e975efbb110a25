"""check_drift: 0 on an untouched store; a package altered under its own key is caught."""

from __future__ import annotations

import io

import pytest

from refsight.maintenance.drift import check_drift
from refsight.inputs.images import load_image
from refsight.package import VisualPackage

NAMES = ("chelsea", "coffee", "astronaut", "rocket")


@pytest.fixture
def filled(load, photos, tmp_path, monkeypatch):
    """A store with four references (kept PNG bytes, catalog rows, packages) for tiny-qwen2-vl.

    Encoded one image per forward, as the drift check re-encodes: in float32 a batch
    moves Qwen features by up to ~1e-7 (see test_backend_options), which is not drift.
    """
    from refsight.store import open_store

    backend = load("tiny-qwen2-vl")
    monkeypatch.setattr(backend, "batch_size", 1)
    store = open_store(tmp_path / "store")
    images = []
    for name in NAMES:
        buf = io.BytesIO()
        photos[name].image.save(buf, format="PNG")
        image = load_image(buf.getvalue(), name=name)
        store.catalog.put_image(image.sha256, buf.getvalue(), "PNG")
        store.catalog.add_reference(name, image.sha256, {})
        images.append(image)
    for package in backend.encode(images):
        store.packages.put(package)
    yield store, backend
    store.close()


def test_untouched_store_has_zero_drift(filled):
    store, backend = filled
    report = check_drift(store, backend, store.catalog.list_references(), sample=3, seed=7, threshold=0.0)
    assert report.ok and len(report.packages) == 3 and report.skipped == 0
    assert report.max_abs_diff == 0.0 and report.tokens_agree
    assert all(p.max_rel_diff == 0.0 for p in report.packages)
    data = report.to_dict()
    assert data["ok"] is True and data["checked"] == 3 and data["runtime"]["device"] == "cpu"
    assert all(p["stored_provenance"]["device"] == "cpu" for p in data["packages"])
    again = check_drift(store, backend, reversed(store.catalog.list_references()), sample=3, seed=7, threshold=0.0)
    assert [p.ref_id for p in again.packages] == [p.ref_id for p in report.packages]  # the seed fixes the draw


@pytest.mark.slow  # re-encodes the references
def test_perturbed_package_under_the_same_key_is_caught(filled):
    store, backend = filled
    key = _key(backend, store.catalog.get_reference("coffee"))
    good = store.packages.get(key)
    bad = VisualPackage(
        tensors={"features.0": good.tensors["features.0"] + 0.05},
        metadata=dict(good.metadata),
        image_sha256=good.image_sha256,
        fingerprint=good.fingerprint,
    )
    assert bad.key == key
    store.packages.delete(key)  # put() keeps an existing key: replace it the way a bad disk would
    store.packages.put(bad)
    report = check_drift(store, backend, store.catalog.list_references(), sample=4, seed=0, threshold=1e-4)
    assert not report.ok
    by_ref = {p.ref_id: p for p in report.packages}
    assert by_ref["coffee"].ok is False and by_ref["coffee"].max_abs_diff == pytest.approx(0.05, rel=1e-3)
    assert all(p.ok and p.max_abs_diff == 0.0 for name, p in by_ref.items() if name != "coffee")
    assert report.to_dict()["ok"] is False


def test_references_without_a_package_for_this_model_are_skipped(filled, load):
    store, _ = filled
    report = check_drift(store, load("tiny-smolvlm"), store.catalog.list_references(), sample=2, seed=0, threshold=0.0)
    assert report.ok and report.packages == [] and report.skipped == 4


def _key(backend, ref):
    from refsight.package import package_key

    return package_key(ref.image_sha256, backend.fingerprint())
