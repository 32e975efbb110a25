"""The index follows the catalog in O(changes): journal-driven sync, no listing when idle, scoped search."""

from __future__ import annotations

import pytest

from refsight import Engine
from refsight.retrieval.catalog_sync import SyncReport, sync_with_catalog
from refsight.samples import sample_paths


@pytest.fixture
def engine(tmp_path, pixel_embedder):
    with Engine(tmp_path / "store", model="toy", embedder=pixel_embedder) as engine:
        for name in ("chelsea", "coffee", "rocket"):
            engine.add(sample_paths()[name], ref_id=name)
        yield engine


def _sync(engine, loads, **kwargs) -> SyncReport:
    def load(row):
        loads.append(row.ref_id)
        return engine.reference_image(row)

    return sync_with_catalog(engine.retrieval.retriever(), engine.store.catalog, engine.namespace, load, **kwargs)


def _indexed(engine) -> dict:
    retriever = engine.retrieval.retriever()
    return retriever.db.entries_by_ref(retriever.embedder.digest, engine.namespace)


def test_sync_decodes_only_what_changed_and_reads_no_listing_when_idle(engine):
    loads: list[str] = []
    first = _sync(engine, loads)
    assert first.full and first.indexed == 3 and sorted(loads) == ["chelsea", "coffee", "rocket"]

    # Nothing changed: no image decoded and the catalog's references table never read.
    loads.clear()
    statements: list[str] = []
    engine.store.catalog._db.connection().set_trace_callback(statements.append)
    try:
        idle = _sync(engine, loads)
    finally:
        engine.store.catalog._db.connection().set_trace_callback(None)
    assert idle == SyncReport(first.revision, 0, 0, full=False) and loads == []
    assert statements and not any('"references"' in s for s in statements)

    # Changes made straight in the catalog (as another process would): one new reference,
    # new metadata on one, one removed. Only those are touched.
    catalog = engine.store.catalog
    engine.add(sample_paths()["horse"], ref_id="horse")
    catalog.add_reference("chelsea", catalog.get_reference("chelsea").image_sha256, {"kind": "cat"})
    catalog.remove_reference("rocket")
    step = _sync(engine, loads)
    assert not step.full and (step.indexed, step.removed) == (2, 1)
    assert loads == ["horse"]  # chelsea's new metadata reuses its cached vector: no decode
    indexed = _indexed(engine)
    assert sorted(indexed) == ["chelsea", "coffee", "horse"]
    assert indexed["chelsea"].metadata == {"kind": "cat"}
    assert step.revision == catalog.revision()


def test_rebuild_lists_everything_again_and_keeps_the_same_entries(engine):
    loads: list[str] = []
    _sync(engine, loads)
    before = {ref_id: entry.image_sha256 for ref_id, entry in _indexed(engine).items()}
    loads.clear()
    rebuilt = _sync(engine, loads, rebuild=True)
    assert rebuilt.full and rebuilt.indexed == 3 and loads == []  # every vector was cached: nothing decoded
    assert {ref_id: entry.image_sha256 for ref_id, entry in _indexed(engine).items()} == before


def test_a_lost_sync_mark_falls_back_to_a_full_diff(engine):
    loads: list[str] = []
    _sync(engine, loads)
    retriever = engine.retrieval.retriever()
    retriever.db.mark_synced(retriever.embedder.digest, engine.namespace, None)
    engine.store.catalog.remove_reference("coffee")
    loads.clear()
    report = _sync(engine, loads)
    # the full diff finds the removal and re-decodes nothing that is already indexed as is
    assert report.full and (report.indexed, report.removed) == (0, 1) and loads == []
    assert sorted(_indexed(engine)) == ["chelsea", "rocket"]


def test_search_restricted_to_ids_only_returns_those(engine):
    everything = engine.search(image=sample_paths()["chelsea"], k=3).to_dict()["results"]
    assert everything[0]["ref_id"] == "chelsea"
    scoped = engine.search(
        image=sample_paths()["chelsea"], k=3, restrict_to=["coffee", "rocket", "absent"]
    ).to_dict()
    assert sorted(r["ref_id"] for r in scoped["results"]) == ["coffee", "rocket"]
    # the scores are the same scores, only the scope differs
    scores = {r["ref_id"]: r["score"] for r in everything}
    assert all(scores[r["ref_id"]] == r["score"] for r in scoped["results"])


def test_repeated_searches_skip_the_index_bookkeeping_when_nothing_was_committed(engine):
    engine.search(image=sample_paths()["coffee"], k=1)
    db = engine.retrieval.retriever().db
    statements: list[str] = []
    db._conn.set_trace_callback(statements.append)
    try:
        assert engine.search(image=sample_paths()["coffee"], k=1).ref_ids[0] == "coffee"
    finally:
        db._conn.set_trace_callback(None)
    assert not any("COUNT(" in s for s in statements), statements


def test_a_mark_ahead_of_the_catalog_means_another_catalog_and_forces_a_full_diff(engine):
    loads: list[str] = []
    _sync(engine, loads)
    retriever = engine.retrieval.retriever()
    retriever.db.mark_synced(retriever.embedder.digest, engine.namespace, 10_000)
    engine.store.catalog.remove_reference("rocket")
    report = _sync(engine, loads)
    assert report.full and report.removed == 1 and sorted(_indexed(engine)) == ["chelsea", "coffee"]
    assert report.revision == engine.store.catalog.revision()


@pytest.mark.parametrize("share", [True, False], ids=["shared", "isolated"])
def test_isolated_tenants_never_reuse_each_others_vectors_through_the_engine(tmp_path, share):
    """Issue 25 item 6, wired: index, search, compare's recall and ingest pass the request's scope down, so
    with isolated tenants each tenant's vectors are cached under its own key (no timing tells it another
    tenant holds the image); shared, one vector serves all."""
    from refsight.retrieval.vectors import vector_key

    photo = sample_paths()["chelsea"]
    # The default embedder: ingest loads it on its workers by registry name.
    with Engine(tmp_path / "store", model="toy", share_packages=share) as engine:
        retriever = engine.retrieval.retriever()
        sha = engine.add(photo, ref_id="cat", namespace="tenant-a").image_sha256

        def cached(namespace: str) -> bool:
            key = vector_key(retriever.embedder.digest, None if share else namespace)
            return sha in retriever.db.get_vectors(key, [sha])

        engine.index(namespace="tenant-a")
        assert cached("tenant-a") and cached("tenant-c") is share
        folder = tmp_path / "to-ingest"
        folder.mkdir()
        (folder / "cat.jpg").write_bytes(photo.read_bytes())
        engine.ingest(folder, namespace="tenant-b", attributes=())
        assert cached("tenant-b")  # the ingest writer cached it under the tenant's key
        engine.add(photo, ref_id="cat", namespace="tenant-c")
        result = engine.compare(photo, criteria="fur", top_k=1, attributes=(), namespace="tenant-c")  # recall syncs
        assert [row["ref_id"] for row in result.to_dict()["results"]] == ["cat"]
        assert cached("tenant-c")
        for namespace in ("tenant-a", "tenant-b", "tenant-c"):
            assert len(engine.search(image=photo, k=5, namespace=namespace).ref_ids) == 1


@pytest.mark.parametrize("share", [True, False], ids=["shared", "isolated"])
def test_isolated_tenants_never_reuse_each_others_imagenet_records(tmp_path, share):
    """Issue 25 item 6: the ImageNet attribute record of an image is kept per tenant scope when tenants are
    isolated (computed again for the second tenant), once for the store when they share."""
    photo = sample_paths()["chelsea"]
    with Engine(tmp_path / "store", model="toy", share_packages=share) as engine:
        sha = engine.add(photo, ref_id="cat", namespace="tenant-a", attributes=("imagenet",)).image_sha256
        records = engine.attribute_records
        computed = records.store.misses
        engine.add(photo, ref_id="cat", namespace="tenant-b", attributes=("imagenet",))
        assert records.store.misses - computed == (0 if share else 1)
        source = records.imagenet()
        subjects = [sha] if share else [f"{sha}@tenant-a", f"{sha}@tenant-b"]
        for subject in subjects:
            assert records.store.get(subject, source.fingerprint, source.schema_digest) is not None
        result = engine.compare(photo, criteria="a tabby cat", top_k=1, namespace="tenant-b")
        assert [row["ref_id"] for row in result.to_dict()["results"]] == ["cat"]
