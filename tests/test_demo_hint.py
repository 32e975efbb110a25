"""The demo's last line tells a newcomer how to browse what it stored."""

from __future__ import annotations

from refsight.environment import default_model
from refsight.demo import browse_hint


def test_browse_hint_names_only_what_differs_from_the_defaults():
    assert browse_hint(None, default_model()) == "refsight serve, then open http://127.0.0.1:8000/"
    assert browse_hint("/tmp/s", "hf:x/y") == "refsight serve --store /tmp/s --model hf:x/y, then open http://127.0.0.1:8000/"
