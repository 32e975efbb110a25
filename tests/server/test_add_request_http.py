"""The add route builds ONE AddRequest of its body (the server's ``ingest_attributes`` its policy), and
the service takes only a request that names the tenant's namespace."""

from __future__ import annotations

import pytest
from live_server import b64, photo_png

from refsight import AddRequest
from refsight.samples import sample_paths


def test_the_add_route_builds_a_request_with_the_servers_attribute_policy(make_server):
    server = make_server(ingest_attributes=())
    with server.client() as client:
        response = client.post("/v1/references", json={"image": b64(photo_png()), "id": "cat", "metadata": {"n": 1}})
        assert response.status_code == 201, response.text
        assert response.json()["ref_id"] == "cat"
        assert client.get("/v1/references/cat").json()["metadata"] == {"n": 1}


def test_the_service_takes_only_a_request_naming_the_tenants_namespace(server):
    with pytest.raises(ValueError, match="names the tenant's namespace"):
        server.in_pool(server.service.add, AddRequest(sample_paths()["chelsea"]))
