"""Failures inside the model become JSON 500s with a stable code and no internals."""

from __future__ import annotations

import logging

import pytest

from live_server import assert_error
from refsight.backends.registry import register_backend
from refsight.backends.toy import ToyBackend
from refsight.errors import GenerationError


class Crashing(ToyBackend):
    """Raises from generate: a plain bug (``crash``) or a translated runtime failure (``fail``)."""

    def generate(self, requests, **options):
        text = requests[0].segments[-1]
        if text == "crash":
            raise RuntimeError("secret internal detail /etc/passwd")
        raise GenerationError(self.name, "CUDA out of memory at /opt/secret/path")


@pytest.fixture
def crashing(make_server, backend_registry):
    register_backend("crashing-toy-server-tests", lambda name, **options: Crashing(name))
    return make_server(model="crashing-toy-server-tests")


@pytest.mark.parametrize(("prompt", "code"), [("crash", "internal_error"), ("fail", "backend_error")])
def test_model_failures_are_json_500s_without_details(crashing, caplog, prompt, code):
    caplog.set_level(logging.ERROR, logger="refsight.server")
    with crashing.client() as c:
        response = c.post("/v1/chat/completions", json={"model": "crashing-toy-server-tests",
                                                        "messages": [{"role": "user", "content": prompt}]})
        assert_error(response, 500, code)
        assert "secret" not in response.text and "Traceback" not in response.text
        assert c.get("/healthz").status_code == 200  # the server lives on
    assert "secret" in caplog.text  # ... and the operator still gets the details in the log
