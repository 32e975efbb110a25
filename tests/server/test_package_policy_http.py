"""The package-cache policies seen over HTTP, with a real tiny model: compare-then-add, restarts,
tenant isolation field by field, and every library error mapped to a stable status and code."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import refsight
from live_server import assert_error, b64, data_url, photo_png
from refsight.errors import RefsightError
from refsight.server.edge.http_errors import ERROR_STATUS, from_refsight, status_of

MODEL = "tiny-qwen2-vl"
KEYS = {"policy-key-aaaa": "tenant-a", "policy-key-bbbb": "tenant-b"}


def test_compare_then_add_over_http_is_201_and_survives_a_restart(make_server, tmp_path):
    store = tmp_path / "shared-store"
    live = make_server(model=MODEL, store=store)
    cat, cup = photo_png("chelsea", (56, 56)), photo_png("coffee", (56, 56))
    with live.client() as client:
        assert client.post("/v1/references", json={"image": b64(cup), "id": "cup"}).status_code == 201
        compared = client.post("/v1/compare", json={"candidate": b64(cat), "criteria": "short fur", "ref_ids": ["cup"]})
        assert compared.status_code == 200, compared.text
        added = client.post("/v1/references", json={"image": b64(cat), "id": "cat"})
        assert added.status_code == 201, added.text
        assert added.json()["cached"] is True
        listed = {r["ref_id"]: r for r in client.get("/v1/references").json()["references"]}
        assert listed["cat"]["cached"] is True  # on disk, not only in memory
    live.stop()
    again = make_server(model=MODEL, store=store)
    with again.client() as client:
        reply = client.post(
            "/v1/chat/completions",
            json={
                "model": MODEL, "max_tokens": 2,
                "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "refsight://ref/cat"}},
                    {"type": "text", "text": "what is it?"},
                ]}],
            },
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["refsight"]["references_cached"] == [True]
        assert reply.json()["refsight"]["timings_ms"]["encode"] == 0.0


def _chat(client, image: bytes) -> dict:
    reply = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(image)}},
                {"type": "text", "text": "describe"},
            ]}],
        },
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


def _shape(value):
    """Replace every number by whether it is zero, and ids by their type: what must not differ."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items() if k not in ("id", "created")}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return value > 0
    return type(value).__name__


def test_another_tenants_image_reads_as_a_cold_one_field_by_field(make_server):
    live = make_server(model=MODEL, keys=KEYS)
    known, fresh = photo_png("chelsea", (56, 56)), photo_png("chelsea", (56, 56), flip=True)
    with live.client("policy-key-aaaa") as a, live.client("policy-key-bbbb") as b:
        assert a.post("/v1/references", json={"image": b64(known), "id": "cat"}).status_code == 201
        _chat(a, known)
        # Tenant B: the image A holds, and one nobody holds. The replies must not differ in kind.
        seen = _chat(b, known)
        cold = _chat(b, fresh)
        assert _shape(seen) == _shape(cold)
        assert seen["refsight"]["timings_ms"]["encode"] > 0 and seen["refsight"]["references_cached"] == [False]
        # Both were sent by B before (as chat images), so both are B's own cache hits now; A's copy plays no part.
        added_seen = b.post("/v1/references", json={"image": b64(known), "id": "x"}).json()
        added_cold = b.post("/v1/references", json={"image": b64(fresh), "id": "y"}).json()
        assert _shape(added_seen) == _shape(added_cold)
        a_key = a.get("/v1/references/cat").json()["packages"]
        assert added_seen["package_key"] not in a_key.values()


def _all_error_classes() -> list[type[RefsightError]]:
    for module in pkgutil.walk_packages(refsight.__path__, "refsight."):
        if ".vllm" in module.name or ".llamacpp" in module.name:
            continue  # optional runtimes; their errors are RefsightError subclasses all the same
        try:
            importlib.import_module(module.name)
        except ImportError:
            continue
    found, todo = [], [RefsightError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


@pytest.mark.parametrize("cls", _all_error_classes(), ids=lambda c: c.__name__)
def test_every_library_error_has_a_stable_status_and_code(cls):
    status, code = status_of(cls.__new__(cls))
    assert cls in ERROR_STATUS or any(base in ERROR_STATUS for base in cls.__mro__[1:])
    assert 400 <= status < 600 and code and code.islower()
    # Client errors are 4xx, server-side failures 5xx: never the other way round.
    client_side = issubclass(cls, (refsight.InvalidInputError, refsight.NotFoundError))
    assert (status < 500) == client_side, (cls, status)


def test_server_side_errors_never_leak_their_details():
    error = from_refsight(refsight.StoreError("secret path /srv/x: disk I/O error"))
    assert error.status >= 500 and "secret" not in error.message


def test_unknown_reference_over_http_is_a_404_code(make_server):
    live = make_server()
    with live.client() as client:
        assert_error(client.get("/v1/references/nobody"), 404, "reference_not_found")


def test_references_added_over_http_get_their_attribute_records_at_once(make_server, tmp_path):
    from refsight import Engine

    store = tmp_path / "attr-store"
    live = make_server(store=store)  # the toy model; the ImageNet record is real (EfficientNet-Lite0)
    with live.client() as client:
        assert client.post("/v1/references", json={"image": b64(photo_png("chelsea")), "id": "cat"}).status_code == 201
    live.stop()
    with Engine(store, model="toy") as engine:
        records = engine.attribute_records
        source = records.imagenet()
        record = records.store.get(engine.reference("cat").image_sha256, source.fingerprint, source.schema_digest)
        assert record is not None and record["imagenet_top5"]
