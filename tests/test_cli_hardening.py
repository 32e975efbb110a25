"""Issue 18 (hardening), the CLI's rows: hostile files, paths, disks and text, through the real ``refsight``.

Each test runs the real CLI (a subprocess where the old failure was a hang or a
memory blow-up, so the test itself stays bounded) on a real store and asserts the
exit code, the message, that nothing was written, and time and memory bounds.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hardening_helpers import run_bounded, store_snapshot
from PIL import Image

from refsight.cli import main

# The CLI with the toy model peaks near 150 MiB; /dev/zero used to reach 9 GB in 20 s.
MAX_RSS_MB = 600
MAX_SECONDS = 30


def _png(path, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8), mode="RGB").save(path, format="PNG")
    return str(path)


def _seeded_store(tmp_path):
    store = tmp_path / "store"
    assert main(["--store", str(store), "add", _png(tmp_path / "cat.png"), "--id", "cat", "--model", "toy"]) == 0
    return store


def _assert_refused(result, *needles: str) -> None:
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert result.seconds < MAX_SECONDS, f"took {result.seconds:.1f} s"
    assert result.max_rss_mb < MAX_RSS_MB, f"peak {result.max_rss_mb:.0f} MiB"


# -- row 6: /dev/zero ------------------------------------------------------------------
@pytest.mark.parametrize("command", ["add", "compare"])
def test_dev_zero_is_refused_at_once_in_bounded_memory(tmp_path, command, capsys):
    store = _seeded_store(tmp_path)
    capsys.readouterr()
    before = store_snapshot(store)
    argv = ["--store", str(store), command, "/dev/zero", "--model", "toy"]
    if command == "compare":
        argv += ["--ref", "cat", "--criteria", "short fur", "--no-attributes"]
    result = run_bounded(argv, timeout=60)
    _assert_refused(result, "/dev/zero", "character device", "not a regular file")
    assert store_snapshot(store) == before


def test_a_regular_file_is_read_no_further_than_the_limit(tmp_path):
    from refsight.inputs.reading import FileReadError, read_regular_file

    path = tmp_path / "big"
    path.write_bytes(b"x" * 1000)
    assert read_regular_file(path, 1000) == b"x" * 1000
    with pytest.raises(FileReadError, match="over the 999-byte limit"):
        read_regular_file(path, 999)


# -- row 7: a FIFO -------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["add", "compare", "criteria"])
def test_a_fifo_is_refused_at_once_and_never_blocks(tmp_path, command, capsys):
    store = _seeded_store(tmp_path)
    capsys.readouterr()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    before = store_snapshot(store)
    if command == "add":
        argv = ["add", str(fifo), "--model", "toy"]
    elif command == "compare":
        argv = ["compare", str(fifo), "--ref", "cat", "--criteria", "short fur", "--no-attributes", "--model", "toy"]
    else:  # the rubric file of a compare
        argv = ["compare", _png(tmp_path / "new.png", 1), "--ref", "cat", "--criteria", f"@{fifo}", "--model", "toy"]
    result = run_bounded(["--store", str(store), *argv], timeout=60)
    _assert_refused(result, str(fifo), "FIFO (named pipe), not a regular file")
    assert store_snapshot(store) == before


# -- row 8: a store path the OS refuses --------------------------------------------------------
def test_an_overlong_store_name_is_one_clean_error(tmp_path):
    store = tmp_path / ("x" * 300)
    result = run_bounded(["--store", str(store), "list"], timeout=60)
    _assert_refused(result, "refsight: error: cannot open store directory", "File name too long")
    assert os.listdir(tmp_path) == []  # nothing was created


# -- row 15: control characters in human output ----------------------------------------------
def test_control_characters_are_escaped_in_text_output_and_kept_in_json(tmp_path, capsys):
    store = tmp_path / "store"
    evil = "\x1b[31mRED\x1b]0;pwned\x07\rover\u202e"
    assert main(["--store", str(store), "add", _png(tmp_path / "cat.png"), "--id", "cat",
                 "--meta", f"note={evil}", "--model", "toy"]) == 0
    capsys.readouterr()

    assert main(["--store", str(store), "list"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out and "\x07" not in out
    assert "\\x1b[31mRED" in out and "\\x0dover" in out and "\\u202e" in out

    assert main(["--store", str(store), "--json", "list"]) == 0
    assert json.loads(capsys.readouterr().out)["metadata"]["note"] == evil  # JSON output unchanged

    criteria = "\x1b[2Jwipes the screen; \x1b[31mred"
    code = main(["--store", str(store), "compare", _png(tmp_path / "new.png", 1), "--ref", "cat",
                 "--criteria", criteria, "--no-attributes", "--model", "toy"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "\x1b" not in captured.out and "\\x1b[2Jwipes the screen" in captured.out

    # Error messages quote user input (a path here): escaped too.
    code = main(["--store", str(store), "add", str(tmp_path / "no\x1b[31mfile.png"), "--model", "toy"])
    err = capsys.readouterr().err
    assert code == 1 and "\x1b" not in err and "no\\x1b[31mfile.png" in err


# -- row 9: refsight gc ---------------------------------------------------------------------
def test_refsight_gc_removes_debris_and_keeps_every_reference(tmp_path, capsys):
    store = _seeded_store(tmp_path)
    capsys.readouterr()
    shard = next((store / "images").iterdir())
    (shard / ".tmp-killed.partial").write_bytes(b"half an image")
    pkg_shard = next(p for p in (store / "packages").glob("*/*"))
    (pkg_shard / ".tmp-killed.partial").write_bytes(b"half a package")

    # A fresh leftover is younger than the default grace period: left alone.
    assert main(["--store", str(store), "--json", "gc"]) == 0
    assert json.loads(capsys.readouterr().out)["temp_files"] == 0
    assert main(["--store", str(store), "--json", "gc", "--grace", "0"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["temp_files"] == 2, counts
    assert not list(store.rglob(".tmp-*"))
    assert main(["--store", str(store), "gc"]) == 0
    assert capsys.readouterr().out.startswith("removed 0 temp files")
    assert main(["--store", str(store), "verify"]) == 0
    capsys.readouterr()
    assert main(["--store", str(store), "--json", "list"]) == 0
    assert [r["ref_id"] for r in map(json.loads, capsys.readouterr().out.splitlines())] == ["cat"]


# -- row 10: a full disk ---------------------------------------------------------------------
def test_a_full_disk_is_named_and_loses_nothing(tmp_path, capsys):
    from hardening_helpers import small_tmpfs

    with small_tmpfs(tmp_path / "disk", "4m") as disk:
        store = disk.path / "store"
        assert main(["--store", str(store), "add", _png(tmp_path / "cat.png"), "--id", "cat", "--model", "toy"]) == 0
        capsys.readouterr()
        before = store_snapshot(store)
        disk.fill()
        result = run_bounded(["--store", str(store), "add", _png(tmp_path / "dog.png", 2), "--id", "dog",
                              "--model", "toy"], timeout=60)
        _assert_refused(result, "no space left on device")
        assert "not a refsight store" not in result.stderr
        disk.free()
        assert store_snapshot(store)["references"] == before["references"]
        assert main(["--store", str(store), "verify"]) == 0
        assert main(["--store", str(store), "add", _png(tmp_path / "dog.png", 2), "--id", "dog", "--model", "toy"]) == 0
        capsys.readouterr()
        assert main(["--store", str(store), "--json", "list"]) == 0
        ids = sorted(json.loads(line)["ref_id"] for line in capsys.readouterr().out.splitlines())
        assert ids == ["cat", "dog"]


def test_sqlite_full_errors_are_store_unavailable(tmp_path):
    """The library-level mapping, on a real full file system: SQLite's own errors name the disk."""
    from hardening_helpers import small_tmpfs

    from refsight import StoreUnavailableError, open_store

    with small_tmpfs(tmp_path / "disk", "2m") as disk, open_store(disk.path / "store") as store:
        disk.fill()
        with pytest.raises(StoreUnavailableError, match="no space left on device") as caught:
            # A big row makes SQLite itself grow the file: SQLITE_FULL, not an OSError.
            store.catalog.add_reference("big", "a" * 64, {"blob": "x" * 3_000_000})
        assert caught.value.reason == "no space left on device"
        disk.free()
        assert store.catalog.list_references() == []
        store.catalog.add_reference("small", "a" * 64, {})
        assert [r.ref_id for r in store.catalog.list_references()] == ["small"]


# -- issue 25 item 2: text that is not valid Unicode -------------------------------------------
BAD = "k=\udcff"  # what `--meta $'k=\xff'` puts in sys.argv (surrogateescape)


@pytest.mark.parametrize(
    ("argv", "argument"),
    [
        (["add", "IMG", "--meta", BAD], "--meta"),
        (["add", "IMG", "--id", "cat\udcff"], "--id"),
        (["compare", "IMG", "--ref", "cat", "--criteria", "fur \udcff"], "--criteria"),
        (["compare", "IMG", "--top-k", "1", "--query", "\udcff", "--criteria", "fur"], "--query"),
        (["search", "a cat \udcff"], "TEXT"),
        (["search", "cat", "--where", BAD], "--where"),
        (["generate", "--ref", "cat", "--prompt", "\ud800"], "--prompt"),
        (["add", "IMG", "--model", "toy\udcff"], "--model"),
        (["--catalog", "postgresql://\udcff", "list"], "--catalog"),
    ],
)
def test_text_arguments_that_are_not_valid_unicode_exit_2_naming_the_argument(tmp_path, capsys, argv, argument):
    store = _seeded_store(tmp_path)
    capsys.readouterr()
    before = store_snapshot(store)
    argv = [_png(tmp_path / "new.png", 3) if a == "IMG" else a for a in argv]
    with pytest.raises(SystemExit) as exited:
        main(["--store", str(store), *argv])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert f"argument {argument}: is not valid Unicode text" in err, err
    assert store_snapshot(store) == before


def test_a_file_name_with_undecodable_bytes_is_a_path_not_refused_as_text(tmp_path, capsys):
    store = _seeded_store(tmp_path)
    capsys.readouterr()
    name = os.fsdecode(b"caf\xe9.png")  # a Latin-1 name on a UTF-8 system: "caf\udce9.png"
    _png(tmp_path / name, 4)
    code = main(["--store", str(store), "add", str(tmp_path / name), "--id", "cafe", "--model", "toy"])
    assert code == 0, capsys.readouterr().err


def test_a_stored_value_that_is_not_valid_unicode_never_takes_down_the_output(tmp_path, capsys):
    """A row written before intake refused such text: list and show print it (U+FFFD in text, the JSON escape
    in JSON), no traceback. (Indexing such a row for search is the retrieval index's own read, not the CLI's.)"""
    import sqlite3

    store = _seeded_store(tmp_path)
    with sqlite3.connect(store / "refsight.db") as db:  # as an older version could have stored it
        db.execute("""UPDATE "references" SET metadata = '{"note": "\\udcff"}' WHERE ref_id = 'cat'""")
    capsys.readouterr()
    for argv in (["list"], ["--json", "list"], ["show", "cat"], ["--json", "show", "cat"]):
        code = main(["--store", str(store), *argv])
        captured = capsys.readouterr()
        assert code == 0, (argv, captured.err)
        assert "Traceback" not in captured.err
        assert any(mark in captured.out for mark in ("\ufffd", "\\ufffd", "\\udcff")), (argv, captured.out)


# -- issue 25 items 1 and 7, through the real CLI ---------------------------------------------------
def _alias_bomb() -> str:
    """The issue's ~400-byte rubric: eight levels of nine aliases each (9**9 strings once expanded)."""
    lines = ["criteria:", "- &a0 [" + ",".join(["lol"] * 9) + "]"]
    lines += [f"- &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(60)  # a guard only: the expanded walk took 36 s
@pytest.mark.parametrize("option", ["--criteria", "--attribute-schema"])
def test_a_yaml_alias_bomb_is_refused_at_parse_time(tmp_path, capsys, option):
    store = _seeded_store(tmp_path)
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb())
    candidate = _png(tmp_path / "new.png", seed=3)
    argv = (["compare", candidate, "--criteria", f"@{bomb}", "--ref", "cat", "--model", "toy"] if option == "--criteria"
            else ["add", candidate, "--id", "new", "--model", "toy", "--attribute-schema", str(bomb)])
    capsys.readouterr()
    code = main(["--store", str(store), *argv])
    err = capsys.readouterr().err
    assert code in (1, 2), (code, err)
    assert "anchors and aliases" in err and "Traceback" not in err, err


@pytest.mark.parametrize("version", ["abc", "", "4.0"])
def test_an_unreadable_schema_version_is_one_line_naming_it(tmp_path, capsys, version):
    import sqlite3

    store = _seeded_store(tmp_path)
    with sqlite3.connect(store / "refsight.db") as db:
        db.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (version,))
    capsys.readouterr()
    code = main(["--store", str(store), "list"])
    err = capsys.readouterr().err
    assert code == 1 and "unreadable schema version" in err and repr(version) in err and "Traceback" not in err, err


def test_a_deeply_nested_config_file_is_refused_without_a_recursion_error(tmp_path, capsys):
    store = _seeded_store(tmp_path)
    deep = tmp_path / "deep.toml"
    deep.write_text("[backend]\ndevice = " + "[" * 100_000 + "]" * 100_000 + "\n")
    capsys.readouterr()
    code = main(["--store", str(store), "--config", str(deep), "list"])
    err = capsys.readouterr().err
    assert code in (1, 2) and "deep.toml" in err and "Traceback" not in err and "RecursionError" not in err, err
