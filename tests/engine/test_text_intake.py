"""Issue 25 item 2, the library part: text that is not valid Unicode (lone surrogates, as JSON's
``\\ud800`` escapes and argv's surrogateescape make) is refused wherever it enters, naming the input,
and nothing is stored for it."""

from __future__ import annotations

import pytest

from refsight import Engine
from refsight.errors import ContextLengthError, ImageError, InvalidInputError
from refsight.inputs.images import load_image
from refsight.references import ReferenceSegment
from refsight.requests import GenerationRequest
from refsight.samples import sample_paths

BAD = "\ud800"
ARGV = "caf\udce9"  # b"caf\xe9" read from argv with surrogateescape


@pytest.fixture
def engine(tmp_path, pixel_embedder):
    with Engine(tmp_path / "store", model="toy", embedder=pixel_embedder) as engine:
        engine.add(sample_paths()["chelsea"], ref_id="chelsea")
        yield engine


def _refused(call, *args, **kwargs) -> InvalidInputError:
    with pytest.raises(InvalidInputError) as e:
        call(*args, **kwargs)
    assert "not valid Unicode" in e.value.reason
    return e.value


@pytest.mark.parametrize("metadata", [{BAD: "x"}, {"k": BAD}, {"k": ARGV}, {"k": [{"deep": BAD}]}, {"\ud800": "\udfff"}])
def test_metadata_that_cannot_be_encoded_is_refused_and_nothing_is_stored(engine, metadata):
    error = _refused(engine.add, sample_paths()["coffee"], ref_id="coffee", metadata=metadata)
    assert str(error.input).startswith("metadata")
    assert [r.ref_id for r in engine.references()] == ["chelsea"]  # the tenant's listing stays readable
    assert engine.search("a cat", k=1).ref_ids == ["chelsea"]


def test_criteria_prompts_and_filters_are_checked_where_they_enter(engine):
    photo = sample_paths()["chelsea"]
    assert _refused(engine.compare, photo, criteria=f"is a cat\n{BAD}", ref_ids=["chelsea"]).input == "rubric"
    assert _refused(engine.compare, photo, criteria=[{"text": ARGV}], ref_ids=["chelsea"]).input == "criterion 1"
    assert _refused(engine.generate, f"what {BAD}?", ref_ids=["chelsea"]).input == "prompt"
    assert _refused(engine.chat, [ReferenceSegment("chelsea"), ARGV]).input == "segments[1]"
    assert _refused(engine.chat, ["hello"], json_schema={"type": "object", "title": BAD}).input == "json_schema.title"
    assert _refused(engine.search, "a cat", where={"kind": BAD}).input == "where.kind"
    assert _refused(engine.references, namespace=ARGV).input == "namespace"


def test_a_path_with_undecodable_bytes_is_still_read_and_named_printably(engine, tmp_path):
    import os

    path = tmp_path / os.fsdecode(b"photo-\xff.png")
    path.write_bytes(sample_paths()["coffee"].read_bytes())
    result = engine.add(path)
    assert result.ref_id.startswith("photo") and result.ref_id.isascii()  # a derived id is always safe text
    assert engine.reference(result.ref_id).image_sha256 == result.image_sha256
    broken = tmp_path / os.fsdecode(b"broken-\xfe.png")
    broken.write_bytes(b"not an image")
    failure = next(iter(engine.add_many([broken])))
    failure.to_dict()["input"].encode("utf-8")  # printable: a JSON reply or a terminal can show it
    assert "\ufffd" in failure.input


def test_what_the_runtime_cannot_render_is_refused_before_any_image_is_encoded(engine):
    # The backend's own rules (here: the toy renders every prompt in its template, and constrains no answer) are
    # asked before the images are resolved, so a request it must refuse costs no encode.
    backend = engine.models.backend(engine.model)
    before = backend.encode_calls
    photo = sample_paths()["coffee"].read_bytes()
    with pytest.raises(InvalidInputError) as e:
        engine.chat(["describe", photo], raw_prompt=True)
    assert e.value.input == "requests[0].raw_prompt"
    with pytest.raises(InvalidInputError) as e:
        engine.chat(["describe", photo], prompt_end="continue", turns=[("user", 1), ("assistant", 1)])
    assert e.value.input == "prompt_end"
    with pytest.raises(InvalidInputError, match="does not support constrained decoding") as e:
        engine.chat(["describe", photo], json_schema={"type": "object"})  # the toy compiles no grammar
    assert e.value.input == "json_schema"
    with pytest.raises(InvalidInputError, match="does not report a prompt's evaluation") as e:
        engine.chat(["describe", photo], on_text=lambda piece: None, on_prompt=lambda *counts: None)
    assert e.value.input == "on_prompt"
    assert backend.encode_calls == before


def test_a_bad_image_is_refused_before_any_image_of_the_prompt_is_encoded(engine):
    # Every image sent inline is decoded and checked first: the good photo before the bad one costs no encode.
    backend = engine.models.backend(engine.model)
    before = backend.encode_calls
    with pytest.raises(ImageError) as e:
        engine.chat(["first", sample_paths()["coffee"].read_bytes(), "then", b"not an image at all"])
    assert e.value.input == "<19 bytes>"
    assert backend.encode_calls == before


def test_a_reference_named_twice_in_a_prompt_is_read_once(engine, monkeypatch):
    reads = []
    real_get = engine.book.get
    monkeypatch.setattr(engine.book, "get", lambda ref_id, **kw: reads.append(ref_id) or real_get(ref_id, **kw))
    result = engine.chat([ReferenceSegment("chelsea"), "and again", ReferenceSegment("chelsea"), "same?"])
    assert reads == ["chelsea"]
    assert result.references_cached == [True, True]


def test_every_generation_counts_its_prompt_before_any_model_work(engine):
    # Not only a chat: the judge, the reranker and a caller of the backend alone get the same size check, from the
    # runtime itself (here: the text's estimate, over the request's max_prompt_tokens), before any encode or prefill.
    backend = engine.models.backend(engine.model)
    before = backend.encode_calls
    photo = load_image(sample_paths()["coffee"])
    request = GenerationRequest(["word " * 100, photo], max_new_tokens=2, max_prompt_tokens=20)
    with pytest.raises(ContextLengthError) as e:
        backend.generate([request])
    assert (e.value.n_ctx, e.value.input) == (20, "prompt")
    assert e.value.n_prompt_tokens >= 100
    assert backend.encode_calls == before
