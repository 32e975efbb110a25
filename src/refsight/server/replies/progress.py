"""Which stage a running compare is in, for the page's spinner (``GET /v1/compare/progress/{token}``).

A compare is one request: the page cannot see the server's stages from it. So the page names its
compare with a random token (the ``X-Refsight-Progress`` header), and polls this registry while the
request runs. Entries are per tenant (one tenant can never read another's), bounded in number, and
removed when the compare ends.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..edge.http_errors import ApiError

__all__ = ["CompareProgress", "PROGRESS_HEADER", "check_token"]

#: The request header that names a compare's progress token.
PROGRESS_HEADER = "x-refsight-progress"
_TOKEN = re.compile(r"[A-Za-z0-9_-]{8,64}")


def check_token(token: str, name: str = "token") -> str:
    """``token`` when it is 8 to 64 letters, digits, ``_`` or ``-``; else a 400 naming ``name``."""
    if not _TOKEN.fullmatch(token):
        raise ApiError(400, "invalid_input", f"{name}: a progress token is 8 to 64 letters, digits, '_' or '-'")
    return token


class CompareProgress:
    """The stage of each running compare, by (namespace, token); at most ``capacity`` at once."""

    def __init__(self, capacity: int = 1024) -> None:
        self._running: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    @contextmanager
    def tracking(self, namespace: str, token: str | None) -> Iterator[Callable[[str], None] | None]:
        """While the block runs, the compare under ``token`` is visible; yields its ``on_stage`` (None without a token)."""
        if token is None:
            yield None
            return
        key, started = (namespace, token), time.monotonic()

        def on_stage(stage: str) -> None:
            with self._lock:
                self._running[key] = (stage, started)
                self._running.move_to_end(key)
                while len(self._running) > self._capacity:  # the oldest first: a bound, not an error
                    self._running.popitem(last=False)

        on_stage("starting")
        try:
            yield on_stage
        finally:
            with self._lock:
                self._running.pop(key, None)

    def get(self, namespace: str, token: str) -> dict[str, Any] | None:
        """``{"stage", "elapsed_ms"}`` of the tenant's compare under ``token``, or None when none runs."""
        with self._lock:
            found = self._running.get((namespace, token))
        if found is None:
            return None
        stage, started = found
        return {"stage": stage, "elapsed_ms": round((time.monotonic() - started) * 1000, 1)}
