"""The one back-off of refsight's remote tiers (the Redis tier and the bucket's client): healthy, backing off with a
doubling delay, found again by one probe at a time; counted, and logged once when down and once when back.

The clock is the breaker's own parameter (the tiers pass ``time.monotonic``); the real tiers meet real outages in
tests/store/test_store_redis.py and tests/store/test_store_bucket.py.
"""

from __future__ import annotations

import logging

import pytest

from refsight.vllm_connector.refsight_breaker import Breaker


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _breaker(clock: _Clock) -> Breaker:
    return Breaker("test tier", logger=logging.getLogger("refsight.test.breaker"), meanwhile="serving from disk",
                   min_backoff_s=0.5, max_backoff_s=2.0, clock=clock)


def test_a_failure_backs_off_one_probe_at_a_time_doubling_to_the_cap_and_a_success_resets(caplog):
    clock = _Clock()
    breaker = _breaker(clock)
    assert breaker.allow() and breaker.available and breaker.retry_in() == 0.0
    with caplog.at_level(logging.WARNING, "refsight.test.breaker"):
        breaker.failed(TimeoutError("read timeout"))
        assert not breaker.available and breaker.retry_in() == 0.5
        assert not breaker.allow() and not breaker.due()  # backing off: skipped, no call
        delays = []
        for _ in range(4):  # each failed probe doubles the delay, up to max_backoff_s
            clock.now += breaker.retry_in()
            assert breaker.due() and breaker.allow()  # this caller probes ...
            assert not breaker.allow() and not breaker.due()  # ... alone
            breaker.failed(TimeoutError("read timeout"))
            delays.append(breaker.retry_in())
        assert delays == [1.0, 2.0, 2.0, 2.0]
        clock.now += 2.0
        assert breaker.allow()
        breaker.succeeded()
    assert breaker.available and breaker.allow() and breaker.retry_in() == 0.0
    assert breaker.info() == {"errors": 5, "skipped": 5, "outages": 1, "available": True}
    assert [r.getMessage() for r in caplog.records] == [
        "refsight: test tier failed (read timeout); serving from disk, retrying in 0.5 s",
        "refsight: test tier is reachable again",
    ]
    breaker.failed(OSError("refused"))  # the next outage starts from min_backoff_s again
    assert breaker.retry_in() == 0.5 and breaker.info()["outages"] == 2


def test_a_call_that_fails_after_the_outage_began_neither_extends_it_nor_counts_another():
    clock = _Clock()
    breaker = _breaker(clock)
    breaker.failed(TimeoutError("first"))
    clock.now += 0.2
    breaker.failed(TimeoutError("a call that was already out"))
    assert breaker.retry_in() == pytest.approx(0.3) and breaker.info()["outages"] == 1 and breaker.info()["errors"] == 2


def test_a_refusal_is_an_answer_an_error_but_no_back_off():
    clock = _Clock()
    breaker = _breaker(clock)
    breaker.failed(TimeoutError("down"))
    clock.now += 0.5
    assert breaker.allow()
    breaker.refused()  # e.g. Redis answered OOM: it is reachable
    assert breaker.available and breaker.info()["errors"] == 2
    breaker.skip()  # a caller that asked due() and prepared nothing counts its skipped call
    assert breaker.info()["skipped"] == 1
