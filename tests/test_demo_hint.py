"""The demo's last line tells a newcomer how to browse what it stored."""

from __future__ import annotations

from refsight.support.environment import default_model
from refsight.demo import browse_hint


def test_browse_hint_names_only_what_differs_from_the_defaults():
    assert browse_hint(None, default_model()) == "refsight serve, then open http://127.0.0.1:8000/"
    assert browse_hint("/tmp/s", "hf:x/y") == "refsight serve --store /tmp/s --model hf:x/y, then open http://127.0.0.1:8000/"


def test_the_demo_keeps_its_own_store_apart_from_the_users(monkeypatch, tmp_path):
    from refsight.support.environment import default_store_dir, demo_store_dir

    monkeypatch.delenv("REFSIGHT_DEMO_STORE", raising=False)
    monkeypatch.setenv("REFSIGHT_STORE", str(tmp_path / "mine"))
    assert demo_store_dir() != default_store_dir() and demo_store_dir().name == "demo"
    monkeypatch.setenv("REFSIGHT_DEMO_STORE", str(tmp_path / "tour"))
    assert demo_store_dir() == tmp_path / "tour"
