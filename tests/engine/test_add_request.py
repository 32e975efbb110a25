"""AddRequest: one reference to add, built once by a front door and checked once, taken whole by
``Engine.add`` (its keywords are a thin builder), and the one 'a request or keywords, not both' rule."""

from __future__ import annotations

import pytest

from refsight import AddRequest, Engine
from refsight.errors import InvalidInputError
from refsight.samples import sample_paths


@pytest.fixture
def photos() -> dict[str, str]:
    return {name: str(path) for name, path in sample_paths().items()}


def test_the_attributes_are_checked_once_when_the_request_is_built(photos):
    with pytest.raises(InvalidInputError, match="unknown sources") as error:
        AddRequest(photos["chelsea"], attributes=["imagenet", "colour"])
    assert error.value.input == "attributes"
    assert AddRequest(photos["chelsea"], attributes="imagenet").attributes == ("imagenet",)


def test_engine_add_takes_a_request_whole_and_its_keywords_build_the_same_one(tmp_path, photos):
    with Engine(tmp_path / "store", model="toy") as engine:
        whole = engine.add(AddRequest(photos["chelsea"], ref_id="cat", metadata={"species": "cat"}))
        built = engine.add(photos["coffee"], ref_id="cup", metadata={"species": "cup"})
        assert (whole.ref_id, built.ref_id) == ("cat", "cup")
        assert engine.reference("cat").metadata == {"species": "cat"}
        assert engine.reference("cup").metadata == {"species": "cup"}


def test_a_request_and_keywords_together_are_refused_and_add_nothing(tmp_path, photos):
    with Engine(tmp_path / "store", model="toy") as engine:
        with pytest.raises(InvalidInputError, match="give a AddRequest or keywords, not both"):
            engine.add(AddRequest(photos["chelsea"]), ref_id="cat")
        assert engine.references() == []


def test_a_bad_reference_still_fails_alone_as_before(tmp_path, photos):
    # The reference's own checks stay the book's: the same error Engine.add always raised.
    with Engine(tmp_path / "store", model="toy") as engine:
        with pytest.raises(InvalidInputError):
            engine.add(AddRequest(photos["chelsea"], ref_id="no spaces allowed"))
        assert engine.references() == []


def test_the_image_may_still_come_as_the_source_keyword(tmp_path, photos):
    with Engine(tmp_path / "store", model="toy") as engine:
        assert engine.add(source=photos["chelsea"], ref_id="cat").ref_id == "cat"
