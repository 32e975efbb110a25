"""StoreIndex over a real store: vectors scoped per tenant (issue 25 item 6) and poisoned rows (item 2)."""

from __future__ import annotations

import numpy as np
import pytest
from sync_workers import DIM, HashEmbedder, image_bytes

from refsight.inputs.images import load_image
from refsight.retrieval.store_index import StoreIndex
from refsight.store import open_store


class CountingEmbedder(HashEmbedder):
    """Counts the images it embeds: what decides how long indexing takes."""

    def __init__(self) -> None:
        self.embedded = 0

    def _embed_images(self, images):
        self.embedded += len(images)
        return super()._embed_images(images)


class Tenants:
    """A real store, its StoreIndex and a counting embedder; ``add`` keeps an image and its reference."""

    def __init__(self, root) -> None:
        self.store = open_store(root)
        self.embedder = CountingEmbedder()
        self._kept = {}
        self.index = StoreIndex(self.store.derived_root, self.store.catalog, lambda row: self._kept[row.image_sha256],
                                embedder=self.embedder)

    def add(self, ref_id: str, n: int, namespace: str, metadata=None) -> None:
        data = image_bytes(n)
        image = self._kept.setdefault(load_image(data).sha256, load_image(data))
        self.store.catalog.ingest_reference(ref_id, image.sha256, data, "PNG", metadata or {}, namespace=namespace)

    def everything(self, namespace: str, scope=None) -> list[str]:
        vector = np.ones(DIM, np.float32)
        return sorted(self.index.search(text=None, image=None, k=100, namespace=namespace, vector=vector, scope=scope).ref_ids)

    def close(self) -> None:
        self.index.close()
        self.store.close()


@pytest.fixture
def tenants(tmp_path):
    opened = Tenants(tmp_path / "store")
    yield opened
    opened.close()


def _same_image_in_two_tenants(tenants: Tenants) -> None:
    tenants.add("cat", 1, "tenant-a")
    tenants.add("the-cat", 1, "tenant-b")  # the same picture, another tenant


def test_isolated_tenants_never_reuse_each_others_reference_vectors(tenants):
    _same_image_in_two_tenants(tenants)
    assert tenants.everything("tenant-a", scope="tenant-a") == ["cat"]
    assert tenants.embedder.embedded == 1
    # Tenant B's indexing embeds the image again: its timing cannot tell that tenant A holds it.
    assert tenants.everything("tenant-b", scope="tenant-b") == ["the-cat"]
    assert tenants.embedder.embedded == 2
    rows = tenants.store.catalog.changes_since(None, namespace="tenant-b").changed
    vectors = tenants.index.reference_vectors(rows, scope="tenant-b")
    assert vectors.shape == (1, DIM) and tenants.embedder.embedded == 2  # cached for tenant B now


def test_shared_tenants_embed_an_image_once(tenants):
    _same_image_in_two_tenants(tenants)
    assert tenants.everything("tenant-a") == ["cat"] and tenants.everything("tenant-b") == ["the-cat"]
    assert tenants.embedder.embedded == 1


def test_a_poisoned_row_never_takes_down_a_search(tenants):
    """A stored row whose metadata holds lone surrogates (issue 25 item 2) is indexed and found, printable."""
    tenants.add("poisoned", 2, "tenant-a", {"k": "v"})
    conn = tenants.store._db.connection()
    conn.execute("""UPDATE "references" SET metadata = '{"\\ud800":"\\udfff"}' WHERE ref_id = 'poisoned'""")
    assert tenants.everything("tenant-a") == ["poisoned"]
    retriever = tenants.index.retriever()
    entry = retriever.db.entry_for_ref(retriever.embedder.digest, "tenant-a", "poisoned")
    assert entry.metadata == {"\ufffd": "\ufffd"}
