"""The request context resolved once at the Engine's front door, the one settings merge, and the
cross-field rules the library checks (front ends keep no copy of them)."""

from __future__ import annotations

import pytest

from refsight import Engine
from refsight.backends.options import BackendOptions
from refsight.errors import InvalidInputError
from refsight.samples import sample_paths
from refsight.settings import CONFIG_NAME, load_settings

CONFIG = """
[backend]
dtype = "bfloat16"

[models."new-model"]
max_pixels = 12544

[models."old-model"]
revision = "v1"
"""


@pytest.fixture
def engine(tmp_path, pixel_embedder):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / CONFIG_NAME).write_text(CONFIG)
    with Engine(tmp_path / "store", model="new-model", embedder=pixel_embedder,
                backend_options=BackendOptions(device="cpu")) as engine:
        yield engine


def test_each_model_gets_its_own_table_then_the_explicit_options(engine):
    # The prune bug: another model must not be loaded with the default model's [models."NAME"] table.
    assert engine.models.options("old-model") == BackendOptions(dtype="bfloat16", revision="v1", device="cpu")
    assert engine.models.options("new-model") == BackendOptions(dtype="bfloat16", max_pixels=12544, device="cpu")
    assert engine.context(model="old-model").options == engine.models.options("old-model")


def test_explicit_options_win_over_the_file_and_the_merge_is_settings_own(tmp_path):
    (tmp_path / CONFIG_NAME).write_text(CONFIG)
    settings = load_settings(tmp_path)
    assert settings.backend_options("old-model", BackendOptions(revision="v2")).revision == "v2"
    assert settings.backend_options("old-model").revision == "v1"


def test_a_namespace_becomes_a_scope_in_one_place(tmp_path):
    with Engine(tmp_path / "shared", model="toy") as shared, Engine(tmp_path / "iso", model="toy", share_packages=False) as iso:
        assert shared.context("tenant-a").scope is None
        assert iso.context("tenant-a").scope == "tenant-a"
        assert iso.context().namespace == iso.namespace == "default"
        a, b = iso.context("tenant-a"), iso.context("tenant-b")
        sha = "ab" * 32
        assert a.package_key(sha) != b.package_key(sha) != shared.context("tenant-a").package_key(sha)


def test_the_cache_switches_travel_as_given(engine):
    assert engine.context().prefix_states
    assert not engine.context(prefix_states=False).prefix_states
    assert not engine.context(use_cache=False).prefix_states  # pixels: no package keys to key a state by
    assert engine.prefixes.for_request(engine.context(prefix_states=False)) is None
    assert engine.prefixes.for_request(engine.context()) is engine.prefixes
    with pytest.raises(InvalidInputError) as e:
        engine.context(use_cache="no")
    assert e.value.input == "use_cache"


@pytest.mark.parametrize("namespace", ["\ud800", "tenant-\udcff", 7])
def test_a_namespace_that_is_no_text_is_refused_at_the_front_door(engine, namespace):
    with pytest.raises(InvalidInputError) as e:
        engine.references(namespace=namespace)
    assert e.value.input == "namespace"


@pytest.mark.parametrize("text", ["", "   ", "\ud800 cat"])
def test_search_and_compare_share_one_rule_for_the_query_text(engine, text):
    with pytest.raises(InvalidInputError) as e:
        engine.search(text)
    assert e.value.input == "text"
    with pytest.raises(InvalidInputError) as e:
        engine.compare(sample_paths()["chelsea"], criteria="is a cat", top_k=1, query=text)
    assert e.value.input == "query"


def test_search_takes_exactly_one_of_text_or_image(engine):
    for kwargs in ({}, {"text": "a cat", "image": sample_paths()["chelsea"]}):
        with pytest.raises(InvalidInputError) as e:
            engine.search(**kwargs)
        assert e.value.input == "query"


@pytest.mark.parametrize(
    "options,field",
    [({"rerank": 3}, "rerank"), ({"top_k": 3, "rerank": 2}, "rerank"), ({"recall_k": 5}, "recall_k"),
     ({"top_k": 3, "recall_k": 2}, "recall_k"), ({"top_k": 0}, "top_k"), ({"top_k": True}, "top_k")],
)
def test_the_compare_counts_are_checked_by_the_library(engine, options, field):
    with pytest.raises(InvalidInputError) as e:
        engine.compare(sample_paths()["chelsea"], criteria="is a cat", **options)
    assert e.value.input == field
