"""Attribute records with the real models: EfficientNet-Lite0 (ImageNet) and all-MiniLM-L6-v2."""

from __future__ import annotations

import json

import pytest

from refsight.errors import InvalidInputError
from refsight.inputs.rubric import parse_rubric
from refsight.judge import (
    AttributeSchema,
    AttributeSpec,
    AttributeStore,
    ImageNetAttributeSource,
    VlmAttributeSource,
    merge_records,
    settle_criteria,
)
from refsight.judge.attribute_sources import IMAGENET_KEY

from judge_helpers import ScriptedBackend, fake_package, photo

CAT_LABELS = {"tabby", "tiger cat", "Persian cat", "Siamese cat", "Egyptian cat"}


@pytest.fixture(scope="module")
def imagenet(one_thread):
    return ImageNetAttributeSource()


@pytest.fixture(scope="module")
def minilm(one_thread):
    from refsight.embedders import load_minilm

    return load_minilm()


@pytest.fixture(scope="module")
def records(imagenet):
    """ImageNet records of chelsea, a mirrored chelsea, and coffee (one batch through the real classifier)."""
    images = {"chelsea": photo("chelsea"), "flipped": photo("chelsea", flip=True), "coffee": photo("coffee")}
    return dict(zip(images, imagenet.compute(list(images.values()))))


def test_imagenet_record_puts_a_cat_label_in_chelseas_top5(records):
    top = records["chelsea"][IMAGENET_KEY]
    assert len(top) == 5 and all(set(e) == {"label", "score"} for e in top)
    assert CAT_LABELS & {e["label"] for e in top}
    assert [e["score"] for e in top] == sorted((e["score"] for e in top), reverse=True)
    assert not CAT_LABELS & {e["label"] for e in records["coffee"][IMAGENET_KEY]}


def test_is_a_cat_is_settled_from_attributes_for_chelsea_vs_flipped_chelsea(records, minilm):
    rubric = parse_rubric("is a cat; has orange fur; is not a cat; same breed of cat")
    out = settle_criteria(rubric.criteria, records["chelsea"], records["flipped"], minilm)
    cat, fur, negated, breed = out
    assert cat is not None and cat.source == "attributes" and cat.verdict == "match"
    assert 0.5 <= cat.confidence <= 1 and "ImageNet" in cat.evidence
    # conservative: colour, negations and finer claims stay with the VLM
    assert fur is None and negated is None and breed is None


def test_a_confidently_different_image_is_settled_as_a_mismatch(records, minilm):
    [cat] = settle_criteria(parse_rubric("is a cat").criteria, records["chelsea"], records["coffee"], minilm)
    assert cat is not None and cat.verdict == "mismatch" and cat.source == "attributes"


def test_force_vlm_and_missing_records_leave_everything_to_the_vlm(records, minilm):
    criteria = parse_rubric("is a cat").criteria
    assert settle_criteria(criteria, records["chelsea"], records["flipped"], minilm, force_vlm=True) == [None]
    assert settle_criteria(criteria, None, records["flipped"], minilm) == [None]
    assert settle_criteria(criteria, records["chelsea"], {}, minilm) == [None]
    assert settle_criteria(criteria, records["chelsea"], records["flipped"], None) == [None]


def test_unsure_classifications_do_not_settle(minilm):
    weak = {IMAGENET_KEY: [{"label": "tabby", "score": 0.3}, {"label": "bath towel", "score": 0.2}]}
    strong = {IMAGENET_KEY: [{"label": "tabby", "score": 0.9}]}
    unsure = {IMAGENET_KEY: [{"label": "football helmet", "score": 0.16}, {"label": "bobsled", "score": 0.11}]}
    criteria = parse_rubric("is a cat").criteria
    assert settle_criteria(criteria, strong, weak, minilm) == [None]  # 0.3 is not "present"
    assert settle_criteria(criteria, strong, unsure, minilm) == [None]  # low coverage is not "absent"


def test_vlm_attribute_values_settle_attribute_criteria(minilm):
    ref = {"fur_length": "short", "ear_shape": "pointed", "color_pattern": "tabby", "facial_markings": "unknown"}
    same = dict(ref)
    other = dict(ref, fur_length="long", ear_shape="folded")
    criteria = parse_rubric("same fur length; has short fur; ears are pointed; has orange fur; same facial markings").criteria
    a = settle_criteria(criteria, ref, same, minilm)
    assert [(v.verdict if v else None) for v in a] == ["match", "match", "match", None, None]
    assert all(v.source == "attributes" for v in a[:3])
    b = settle_criteria(criteria, ref, other, minilm)
    assert [(v.verdict if v else None) for v in b] == ["mismatch", "mismatch", "mismatch", None, None]
    assert "fur_length: reference 'short', candidate 'long'" in b[0].evidence


# -- schema ----------------------------------------------------------------------------------------


def test_default_schema_and_digest():
    schema = AttributeSchema.default()
    assert schema.names == ["fur_length", "ear_shape", "color_pattern", "facial_markings"]
    js = schema.json_schema()
    assert js["properties"]["fur_length"]["enum"][-1] == "unknown"
    assert js["properties"]["facial_markings"] == {"type": "string", "maxLength": 40}
    assert schema.digest == AttributeSchema.default().digest
    assert schema.digest != AttributeSchema.from_dict({"fur_length": ["short", "long"]}).digest
    assert AttributeSchema.from_dict(schema.to_dict()["attributes"]) == schema


@pytest.mark.parametrize(
    "specs, match",
    [
        ((), "at least one"),
        ((AttributeSpec("Fur Length"),), "a-z, 0-9 and _"),
        ((AttributeSpec("fur"), AttributeSpec("fur")), "duplicate"),
        ((AttributeSpec("imagenet_top5"),), "reserved"),
        ((AttributeSpec("fur", ()),), "non-empty strings"),
        ((AttributeSpec("fur", ("a", "a")),), "unique"),
        ((AttributeSpec("fur", ("unknown",)),), "unique and not 'unknown'"),
    ],
)
def test_bad_schemas(specs, match):
    with pytest.raises(InvalidInputError, match=match):
        AttributeSchema(specs)


# -- sources and store ---------------------------------------------------------------------------


def test_imagenet_source_refuses_packages(imagenet):
    with pytest.raises(InvalidInputError, match="needs the image's pixels"):
        imagenet.compute([fake_package()])


class CountingSource:
    """Wraps a source and counts how many items it computed."""

    def __init__(self, inner):
        self.inner, self.name, self.computed = inner, inner.name, 0

    fingerprint = property(lambda self: self.inner.fingerprint)
    schema_digest = property(lambda self: self.inner.schema_digest)

    def compute(self, items):
        self.computed += len(items)
        return self.inner.compute(items)


def test_store_computes_once_and_reuses_across_instances(tmp_path, imagenet, records):
    source = CountingSource(imagenet)
    images = [photo("chelsea"), photo("coffee")]
    store = AttributeStore(tmp_path)
    first = store.get_or_compute(source, images)
    assert source.computed == 2 and store.misses == 2
    assert first[0] == records["chelsea"]
    again = AttributeStore(tmp_path).get_or_compute(source, [images[1], photo("chelsea", flip=True), images[0]])
    assert source.computed == 3  # only the mirrored image is new
    assert again[0] == first[1] and again[2] == first[0]
    assert (tmp_path / "attributes" / "attributes.sqlite").is_file()


def answer(request):
    """A valid record for whatever schema the request carries."""
    names = request.json_schema["properties"]
    return json.dumps({n: "short" if n == "fur_length" else "unknown" for n in names})


def test_vlm_source_is_keyed_by_image_and_encoder_so_packages_and_images_share_records(tmp_path):
    schema = AttributeSchema.default()
    backend = ScriptedBackend(answer, constrained=True)
    source = VlmAttributeSource(backend, schema)
    store = AttributeStore(tmp_path)
    image = photo("chelsea", (32, 24))
    package = fake_package()
    package.image_sha256 = image.sha256
    [record] = store.get_or_compute(source, [package])
    assert record["fur_length"] == "short" and source.calls == 1
    assert backend.requests[0].json_schema == schema.json_schema()
    assert store.get_or_compute(source, [image]) == [record] and source.calls == 1
    other = VlmAttributeSource(backend, AttributeSchema.from_dict({"fur_length": ["short", "long"]}))
    store.get_or_compute(other, [image])
    assert other.calls == 1  # another schema is another record


def test_vlm_source_retries_once_then_returns_unknowns_that_are_not_stored(tmp_path):
    backend = ScriptedBackend(lambda r: "no idea")
    source = VlmAttributeSource(backend)
    store = AttributeStore(tmp_path)
    [record] = store.get_or_compute(source, [fake_package()])
    assert source.calls == 2 and set(record.values()) - {"unknown"} == {record["error"]}
    store.get_or_compute(source, [fake_package()])
    assert source.calls == 4  # the failure was not cached
    assert merge_records(record, {IMAGENET_KEY: []}) == {**{n: "unknown" for n in source.schema.names}, IMAGENET_KEY: []}
