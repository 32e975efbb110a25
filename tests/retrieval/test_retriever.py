"""Retriever end to end with the real default embedder on the bundled photos."""

from __future__ import annotations

import pytest
from PIL import Image

from refsight.errors import InvalidInputError, InvalidReferenceIdError, ReferenceNotFoundError
from refsight.inputs.images import load_image
from refsight.embedders import EfficientNetConSEEmbedder
from refsight.retrieval import Retriever, default_embedder

from bundled_photos import BUNDLED, bundled_photo

SPECIES = {"chelsea": "cat", "horse": "horse"}


class CountingEmbedder(EfficientNetConSEEmbedder):
    """The real default embedder, counting how many images it actually runs."""

    def __init__(self):
        super().__init__()
        self.images_embedded = 0

    def _embed_images(self, images):
        self.images_embedded += len(images)
        return super()._embed_images(images)


@pytest.fixture(scope="module")
def counting() -> CountingEmbedder:
    return CountingEmbedder()


@pytest.fixture(scope="module")
def shared_root(tmp_path_factory, counting):
    """A store root whose vector cache holds every bundled photo (embedded once per module)."""
    root = tmp_path_factory.mktemp("store")
    with Retriever(root, counting) as r:
        r.rebuild([(n, bundled_photo(n), {"species": SPECIES.get(n, "none"), "index": i}) for i, n in enumerate(BUNDLED)])
    return root


@pytest.fixture
def retriever(shared_root, counting, tmp_path):
    import shutil

    # a private copy of the warm store, so tests may mutate it freely
    shutil.copytree(shared_root / "retrieval", tmp_path / "retrieval")
    r = Retriever(tmp_path, counting)
    yield r
    r.close()


@pytest.mark.parametrize("query,expected", [("a cat", "chelsea"), ("a cup of coffee", "coffee"), ("a rocket", "rocket")])
def test_text_search_ranks_the_right_photo_first(retriever, query, expected):
    hits = retriever.search_text(query, k=3)
    assert hits[0][0] == expected and len(hits) == 3
    assert hits[0][1] > hits[1][1] >= hits[2][1]


def test_image_search_with_a_flipped_cat_finds_chelsea(retriever):
    flipped = load_image(bundled_photo("chelsea").image.transpose(Image.Transpose.FLIP_LEFT_RIGHT))
    assert retriever.search_image(flipped, k=1)[0][0] == "chelsea"


def test_each_image_is_embedded_once_across_adds_and_retrievers(retriever, counting, tmp_path):
    before = counting.images_embedded
    retriever.add("cat-again", bundled_photo("chelsea"), {"species": "cat"})
    retriever.add("cat-elsewhere", bundled_photo("chelsea"), namespace="other")
    again = Retriever(tmp_path, counting)
    again.add("cat-third", bundled_photo("chelsea"))
    again.close()
    assert counting.images_embedded == before  # all served from the cache
    assert retriever.count() == len(BUNDLED) + 2 and retriever.count("other") == 1


def test_where_filter_restricts_results(retriever):
    assert [r for r, _ in retriever.search_text("a rocket", k=5, where={"species": "cat"})] == ["chelsea"]
    assert retriever.search_text("a cat", k=5, where={"species": "dog"}) == []
    assert [r for r, _ in retriever.search_text("a cat", k=9, where={"index": 2})] == [BUNDLED[2]]
    assert retriever.metadata("horse") == {"species": "horse", "index": BUNDLED.index("horse")}


@pytest.mark.slow  # builds every embedder's index
def test_remove_takes_a_reference_out_of_every_embedders_index(retriever, tmp_path):
    other = Retriever(tmp_path, EfficientNetConSEEmbedder(conse_weight=0.5))
    other.add("chelsea", bundled_photo("chelsea"))
    assert other.search_text("a cat", k=1)[0][0] == "chelsea"
    assert retriever.remove("chelsea") is True
    assert "chelsea" not in [r for r, _ in retriever.search_text("a cat", k=9)]
    assert other.search_text("a cat", k=5) == []  # gone from the other embedder's index too
    assert retriever.remove("chelsea") is False
    with pytest.raises(ReferenceNotFoundError):
        retriever.metadata("chelsea")
    other.close()


def test_readding_an_id_replaces_its_image(retriever):
    retriever.add("coffee", bundled_photo("chelsea"), {"species": "cat"})
    top = retriever.search_text("a cup of coffee", k=9)
    assert "coffee" in [r for r, _ in top] and retriever.count() == len(BUNDLED)
    assert retriever.search_text("a cat", k=2)[0][0] in {"coffee", "chelsea"}


def test_ann_mode_and_rebuild_from_the_database(retriever, tmp_path, counting):
    ann = Retriever(tmp_path, counting, exact_threshold=5)
    assert ann.search_text("a cup of coffee", k=1)[0][0] == "coffee"
    ann.flush()
    index_file = next((tmp_path / "retrieval").glob("*/default/hnsw.bin"))
    index_file.write_bytes(index_file.read_bytes()[:100])  # corrupt it
    fresh = Retriever(tmp_path, counting, exact_threshold=5)
    assert fresh.search_text("a rocket", k=1)[0][0] == "rocket"
    before = counting.images_embedded
    assert fresh.rebuild() == len(BUNDLED)  # from cached vectors: no model call
    assert counting.images_embedded == before
    assert fresh.search_text("a cat", k=1)[0][0] == "chelsea"
    ann.close()
    fresh.close()


def test_search_breadth_applies_to_built_and_loaded_graphs(retriever, tmp_path, counting):
    with pytest.raises(InvalidInputError, match="expansion_search"):
        Retriever(tmp_path, counting, expansion_search=0)
    built = Retriever(tmp_path, counting, exact_threshold=5, expansion_search=7)
    assert built.search_text("a cat", k=1)[0][0] == "chelsea"
    assert built._index("default")._ann.expansion_search == 7
    built.close()
    loaded = Retriever(tmp_path, counting, exact_threshold=5, expansion_search=9)
    assert loaded.search_text("a cat", k=1)[0][0] == "chelsea"
    index = loaded._index("default")
    assert not index.rebuilt and index._ann.expansion_search == 9
    loaded.close()


def test_rebuild_with_items_replaces_the_namespace(retriever):
    assert retriever.rebuild([("only-rocket", bundled_photo("rocket"), {})]) == 1
    assert retriever.search_text("a cat", k=5) == [("only-rocket", pytest.approx(retriever.search_text("a cat", k=1)[0][1]))]


def test_bad_inputs_are_typed_errors(retriever):
    with pytest.raises(InvalidInputError, match="k"):
        retriever.search_text("a cat", k=0)
    with pytest.raises(InvalidInputError):
        retriever.search_text("   ")
    with pytest.raises(InvalidInputError, match="namespace"):
        retriever.search_text("a cat", namespace="../etc")
    with pytest.raises(InvalidInputError, match="where"):
        retriever.search_text("a cat", where={"bad key!": 1})
    with pytest.raises(InvalidInputError, match="where"):
        retriever.search_text("a cat", where={"species": ["cat"]})
    with pytest.raises(InvalidReferenceIdError):
        retriever.add("../x", bundled_photo("coffee"))
    with pytest.raises(InvalidInputError, match="image"):
        retriever.add("x", bundled_photo("coffee").image)
    with pytest.raises(InvalidInputError, match="embedder"):
        Retriever(".", object())


def test_embedder_name_and_default():
    assert default_embedder() is default_embedder()
    assert default_embedder().name == "efficientnet-lite0-conse"
