"""``refsight serve`` with keys warns at start-up when references exist only in namespaces no key maps
to (the CLI adds to ``default`` unless told ``--namespace``), and stays quiet when every one is served."""

from __future__ import annotations

import logging

from refsight.cli import main
from refsight.samples import sample_paths

KEY_A = "key-alpha-0123456789"
KEY_DEFAULT = "key-default-01234567"


def add(store, *extra: str) -> None:
    assert main(["add", str(sample_paths()["chelsea"]), "--store", str(store), "--model", "toy", "--attributes",
                 "none", "--json", *extra]) == 0


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "no key maps to" in r.getMessage()]


def test_references_only_in_an_unmapped_namespace_are_named_at_start_up(make_server, tmp_path, caplog, capsys):
    store = tmp_path / "shared"
    add(store)  # the CLI's default namespace
    add(store, "--namespace", "alpha")
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="refsight.server"):
        make_server(store=store, keys={KEY_A: "alpha"})
    [message] = warnings(caplog)
    assert "1 reference(s) exist only in namespaces no key maps to" in message
    assert "'default'" in message and "--namespace" in message and KEY_A not in message


def test_no_warning_when_a_key_maps_to_every_namespace_with_references(make_server, tmp_path, caplog, capsys):
    store = tmp_path / "served"
    add(store)
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="refsight.server"):
        make_server(store=store, keys={KEY_A: "alpha", KEY_DEFAULT: "default"})
    assert warnings(caplog) == []
