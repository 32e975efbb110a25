"""The stage of a running compare, for the page's spinner: ``X-Refsight-Progress`` + ``GET /v1/compare/progress/{token}``."""

from __future__ import annotations

import threading
import time

import pytest
from live_server import assert_error, b64, photo_png

from refsight import Engine
from refsight.samples import sample_paths

KEYS = {"progress-key-00001": "alpha", "progress-key-00002": "beta"}
TOKEN = "0123456789abcdef0123456789abcdef"


def test_the_engine_tells_each_stage_as_it_starts(tmp_path):
    stages: list[str] = []
    with Engine(tmp_path / "store", model="toy") as engine:
        for name in ("chelsea", "coffee"):
            engine.add(sample_paths()[name], ref_id=name)
        engine.compare(sample_paths()["chelsea"], criteria="striped fur", top_k=1, rerank=2, attributes=(), reranker="embedding",
                       on_stage=stages.append)
    assert stages[0] == "recall" and "rerank" in stages and "judge" in stages
    assert stages.index("recall") < stages.index("rerank") < stages.index("judge")


def _slowed(backend, seconds: float):
    """The toy backend's model calls take ``seconds`` (the stage must last long enough to be seen)."""
    for name in ("generate", "score_yes_no"):
        original = getattr(backend, name)

        def slow(*args, _original=original, **kwargs):
            time.sleep(seconds)
            return _original(*args, **kwargs)

        setattr(backend, name, slow)


@pytest.mark.timeout(120)
def test_a_running_compare_says_its_stage_to_its_own_tenant_only(make_server):
    live = make_server(keys=KEYS)
    with live.client("progress-key-00001") as c:
        assert c.post("/v1/references", json={"image": b64(photo_png()), "id": "cat"}).status_code == 201
        _slowed(live.service.engine.backend(), 2.0)
        answer: dict = {}
        compare = threading.Thread(target=lambda: answer.update(response=c.post(
            "/v1/compare", json={"candidate": b64(photo_png(flip=True)), "criteria": "striped fur", "ref_ids": ["cat"],
                                 "force_vlm": True},
            headers={"X-Refsight-Progress": TOKEN})))
        compare.start()
        seen = set()
        with live.client("progress-key-00001") as poller, live.client("progress-key-00002") as other:
            while compare.is_alive():
                response = poller.get(f"/v1/compare/progress/{TOKEN}")
                if response.status_code == 200:
                    body = response.json()
                    assert set(body) == {"stage", "elapsed_ms"} and body["elapsed_ms"] >= 0
                    seen.add(body["stage"])
                    # Another tenant never sees it, under the same token.
                    assert_error(other.get(f"/v1/compare/progress/{TOKEN}"), 404, "not_found")
                time.sleep(0.1)
        compare.join()
        assert answer["response"].status_code == 200, answer["response"].text
        assert "judge" in seen, seen
        assert_error(c.get(f"/v1/compare/progress/{TOKEN}"), 404, "not_found")  # ended: gone


def test_a_bad_progress_token_is_400_naming_it(make_server):
    live = make_server(keys=KEYS)
    with live.client("progress-key-00001") as c:
        error = assert_error(c.get("/v1/compare/progress/short"), 400, "invalid_input")
        assert error["message"].startswith("token")
        error = assert_error(c.post("/v1/compare", json={"candidate": b64(photo_png()), "criteria": "fur"},
                                    headers={"X-Refsight-Progress": "no spaces allowed"}), 400, "invalid_input")
        assert error["message"].startswith("X-Refsight-Progress")
