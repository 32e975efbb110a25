"""refsight as vLLM's encoder cache: real vLLM servers running refsight's connector on one store.

``refsight vllm-serve MODEL --store DIR`` starts vLLM with the connector (:mod:`refsight.vllm_connector`).
A reference is encoded once, by vLLM, and saved in the store; after a restart, and on another
server sharing the store, it is loaded and never encoded again — counted from the connector
(``vllm_encoder_cache`` in ``Engine.stats()``) and from each server's own log (the connector
logs every item vLLM's encoder ran for). A corrupt or truncated file is encoded again and the
server stays alive; an item without a uuid (the candidate) is never persisted. Greedy tokens
are the same on every path. A fleet on a bucket store (``--store s3://... --local-dir``) shares its
encoder outputs through the bucket, compressed by refsight's codec.
"""

from __future__ import annotations

import re
import time

import pytest

from vllm_helpers import MAX_NEW_TOKENS

pytestmark = pytest.mark.vllm

MODEL = "tiny-qwen2-vl-vllm"
_EVENT = re.compile(r"refsight encoder cache: (encoded|loaded) ([\w-]+)")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The refsight store every server of this module shares."""
    return tmp_path_factory.mktemp("vllm-encoder-cache") / "store"


@pytest.fixture(scope="module")
def images(photos):
    """Three references, two more (mirrored, so no server saw them elsewhere) and a candidate."""
    from PIL import ImageOps

    from refsight.inputs.images import load_image

    mirrored = {f"mirrored-{n}": load_image(ImageOps.mirror(photos[n].image), name=f"mirrored-{n}") for n in ("chelsea", "astronaut")}
    return {**photos, **mirrored}


def _events(server, kind: str) -> list[str]:
    """Items the server's connector logged as ``encoded`` (vLLM's encoder ran) or ``loaded`` (from the store)."""
    return [m.group(2) for m in _EVENT.finditer(server.log.read_text()) if m.group(1) == kind]


def _ask(server, images, names: list[str]) -> tuple[list[int], list[str]]:
    """Greedy tokens of the references ``names`` and the candidate through a new backend; the references' uuids."""
    from refsight.requests import GenerationRequest
    from refsight.backends.vllm.loading import load_vllm_backend
    from refsight.backends.vllm.pixels import reference_uuid

    backend = load_vllm_backend(f"vllm:{server.url}")
    try:
        references = backend.encode([images[n] for n in names])
        candidate = backend.encode([images["rocket"]])[0]
        request = GenerationRequest(
            [*references, "Compare the candidate", candidate, "Same colour?"], max_new_tokens=MAX_NEW_TOKENS,
            prefix_segments=len(references),
        )
        return backend.generate([request])[0].token_ids, [reference_uuid(r.key) for r in references]
    finally:
        backend.close()


def _staged_copies(server) -> list[str]:
    """The checked copies the server's scheduler staged for its worker and has not deleted yet."""
    from pathlib import Path

    folders = set(re.findall(r"staging (\S+)", server.log.read_text()))
    return sorted(p.name for folder in folders for p in Path(folder).glob("refsight-*"))


def _counters(store):
    from refsight.vllm_connector.refsight_ec_store import read_counters

    return read_counters(store)


REFS = ["chelsea", "coffee", "astronaut"]


@pytest.fixture(scope="module")
def first_run(vllm_servers, store, images):
    """The first server on the empty store: it encodes the references and the connector saves them."""
    server = vllm_servers.get(MODEL, 8, store)
    tokens, uuids = _ask(server, images, REFS)
    encoded = _events(server, "encoded")
    vllm_servers.stop(server)
    return tokens, uuids, encoded


def test_the_first_server_encodes_and_saves_references_only(first_run, store):
    tokens, uuids, encoded = first_run
    assert set(uuids) <= set(encoded)
    # Besides the references: the candidate under vLLM's own id, and the backend's one-token probe image.
    others = [e for e in encoded if e not in uuids and not e.startswith("refsight-probe-")]
    assert len(others) == 1 and not others[0].startswith("refsight-")
    files = sorted((store / "vllm-encoder").rglob("*.safetensors"))
    assert len(files) == 3  # the references; the candidate (no uuid) is never persisted
    counters = _counters(store)
    assert (counters["saves"], counters["hits"]) == (3, 0) and counters["bytes"] == sum(f.stat().st_size for f in files)


def test_after_a_restart_no_reference_is_encoded_again(first_run, vllm_servers, store, images):
    from refsight import Engine

    tokens, uuids, _ = first_run
    server = vllm_servers.get(MODEL, 8, store)  # a new process on the same store
    again, _ = _ask(server, images, REFS)
    assert again == tokens
    assert not set(uuids) & set(_events(server, "encoded"))  # vLLM's encoder ran for the candidate only
    assert set(uuids) <= set(_events(server, "loaded"))
    # Each staged copy lives until the requests it was loaded for finish, then goes.
    deadline = time.monotonic() + 10
    while _staged_copies(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _staged_copies(server) == []
    counters = _counters(store)
    assert counters["hits"] >= 3 and counters["saves"] == 3 and counters["corrupt"] == 0
    with Engine(store, model="tiny-qwen2-vl-vllm") as engine:
        shown = engine.stats().to_dict()["vllm_encoder_cache"]
    assert shown["hits"] == counters["hits"] and shown["bytes"] == counters["bytes"] > 0


def test_a_second_server_sharing_the_store_loads_what_the_first_encoded(first_run, vllm_servers, store, images):
    one = vllm_servers.get(MODEL, 8, store)
    other = vllm_servers.get(MODEL, 8, store, replica=1)  # both alive, one store
    names = ["mirrored-chelsea", "mirrored-astronaut"]
    tokens, uuids = _ask(one, images, names)
    assert set(uuids) <= set(_events(one, "encoded"))
    theirs, _ = _ask(other, images, names)
    assert theirs == tokens
    assert not set(uuids) & set(_events(other, "encoded")) and set(uuids) <= set(_events(other, "loaded"))


def test_corrupt_and_truncated_files_are_encoded_again_and_the_server_lives(first_run, vllm_servers, store, images):
    from refsight.vllm_connector.refsight_ec_store import DIRNAME

    tokens, uuids, _ = first_run
    other = vllm_servers.get(MODEL, 8, store, replica=1)  # it never saw REFS: its own caches cannot answer
    assert not set(uuids) & set(_events(other, "encoded") + _events(other, "loaded"))
    files = {uuid: _file_of(store / DIRNAME, uuid) for uuid in uuids}
    flipped = bytearray(files[uuids[0]].read_bytes())
    flipped[-3] ^= 0xFF
    files[uuids[0]].write_bytes(bytes(flipped))
    files[uuids[1]].write_bytes(files[uuids[1]].read_bytes()[:100])
    before = _counters(store)
    again, _ = _ask(other, images, REFS)
    assert again == tokens
    encoded = _events(other, "encoded")
    assert uuids[0] in encoded and uuids[1] in encoded and uuids[2] not in encoded
    assert uuids[2] in _events(other, "loaded")
    assert _counters(store)["corrupt"] == before["corrupt"] + 2
    assert _ask(other, images, REFS)[0] == tokens  # alive, and now served by its own caches
    assert all(f.exists() for f in files.values())  # saved again, whole


def _file_of(root, uuid: str):
    """The connector's file of ``uuid`` (found by its metadata, once decompressed: the fingerprint is the server's)."""
    from refsight.vllm_connector.refsight_codec import decompress

    for path in root.rglob("*.safetensors"):
        if uuid.encode() in bytes(decompress(memoryview(path.read_bytes())))[:1024]:
            return path
    raise AssertionError(f"no file for {uuid}")


def test_a_uuid_sent_with_other_pixels_is_not_served_the_stored_features(first_run, vllm_servers, store, images):
    """A client reusing a reference's uuid for other pixels: the connector compares the pixels' digest
    with the file's, serves nothing (counted ``refused``) and keeps the file; vLLM encodes what was sent."""
    from refsight.vllm_connector.refsight_ec_store import DIRNAME
    from vllm_helpers import pixel_tokens, png_url, post_chat, served_model

    one = vllm_servers.get(MODEL, 8, store)
    _, (uuid,) = _ask(one, images, ["rocket"])  # saved by one; the other server never saw it
    saved = _file_of(store / DIRNAME, uuid).read_bytes()
    other = vllm_servers.get(MODEL, 8, store, replica=1)
    before = _counters(store)
    liar = images["coffee"].image
    body = {
        "model": served_model(other.url), "max_tokens": MAX_NEW_TOKENS, "temperature": 0.0, "return_token_ids": True,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": png_url(liar)}, "uuid": uuid}, {"type": "text", "text": "Describe."},
        ]}],
    }
    tokens = post_chat(other.url, body)["choices"][0]["token_ids"]
    assert tokens == pixel_tokens(other.url, [liar, "Describe."])  # the coffee's own features, not the rocket's
    assert _counters(store)["refused"] == before["refused"] + 1
    assert _file_of(store / DIRNAME, uuid).read_bytes() == saved


def test_the_connector_keeps_within_the_stores_one_quota(first_run, vllm_servers, tmp_path, images):
    """The store's quota (``max_package_bytes``, handed to the connector by ``vllm-serve``) is one quota over
    refsight's packages and vLLM's encoder outputs: with the packages' recorded bytes filling all but one
    byte of it, each save evicts every older file, the newest stays, and the answers do not change."""
    from refsight.store.encoder_outputs import PACKAGES_SOURCE
    from refsight.vllm_connector.refsight_ec_store import DIRNAME, ECStore

    tokens, uuids, _ = first_run
    quota = 10_000_000
    store = tmp_path / "quota-store"
    store.mkdir()
    (store / "refsight.toml").write_text(f'[store]\nmax_package_bytes = {quota}\n')
    ECStore(store / DIRNAME, "").record_external_bytes(PACKAGES_SOURCE, quota - 1)  # what refsight's packages hold
    server = vllm_servers.get(MODEL, 8, store)
    assert f"quota {quota} bytes" in server.log.read_text()
    again, _ = _ask(server, images, REFS)
    assert again == tokens
    files = list((store / DIRNAME).rglob("*.safetensors"))
    counters = _counters(store)
    assert len(files) == 1 and counters["saves"] == 3 and counters["evictions"] == 2
    assert counters["bytes"] == files[0].stat().st_size
    vllm_servers.stop(server)


def test_a_bucket_fleet_shares_its_encoder_outputs_in_the_codecs_stored_form(
        first_run, vllm_servers, s3_server, tmp_path, monkeypatch, images):
    """``vllm-serve MODEL --store s3://... --local-dir DIR``: what one server encoded goes to the bucket in refsight's
    codec's stored form; a second server with an empty folder of its own reads it from there and never encodes it,
    and vLLM answers with the very tokens of a fresh encode."""
    from refsight.vllm_connector.refsight_codec import decompress
    from refsight.vllm_connector.refsight_ec_store import DIRNAME, stored_form
    from refsight.vllm_connector.refsight_objects import ObjectStore

    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)  # the servers' environment: how every S3 tool is configured
    url = s3_server.bucket()
    tokens, uuids, _ = first_run  # a fresh encode, on a directory store
    one = vllm_servers.get(MODEL, 8, url, local_dir=tmp_path / "one")
    assert _ask(one, images, REFS)[0] == tokens and set(uuids) <= set(_events(one, "encoded"))
    bucket = ObjectStore(url)
    stored = sorted(bytes(bucket.get(entry.name)) for entry in bucket.listing(f"{DIRNAME}/"))
    # Exactly the codec's stored form of each file: the tiny model's f32 features of random weights are noise that
    # saves under MIN_RATIO, so they are kept plain (bf16 features shrink: tests/backends/vllm/test_ec_store.py).
    assert len(stored) == 3 and all(blob == stored_form(bytes(decompress(memoryview(blob)))) for blob in stored)
    other = vllm_servers.get(MODEL, 8, url, local_dir=tmp_path / "other")  # nothing in its folder
    assert _ask(other, images, REFS)[0] == tokens
    assert not set(uuids) & set(_events(other, "encoded")) and set(uuids) <= set(_events(other, "loaded"))
    assert sorted(p.read_bytes() for p in (tmp_path / "other" / DIRNAME).rglob("*.safetensors")) == stored
    bucket.close()
