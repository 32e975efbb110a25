"""The `refsight` CLI end to end on a real store, with the toy encoder.

The toy encoder is enough here: these tests are about storage, ids, JSON output,
exit codes and error handling; the model paths are proven in tests/backends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from refsight.cli import main


def run(capsys, *argv: str) -> tuple[int, list, str]:
    """Run the CLI in-process; return (exit code, JSON lines on stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if line.strip()]
    return code, [json.loads(line) for line in lines] if "--json" in argv else lines, err


@pytest.fixture
def store(tmp_path) -> Path:
    return tmp_path / "store"


def snapshot(store: Path) -> dict[str, bytes]:
    """Every file in the store except SQLite's own journal files, by relative path."""
    return {
        str(p.relative_to(store)): p.read_bytes()
        for p in sorted(store.rglob("*"))
        if p.is_file() and not p.name.endswith(("-wal", "-shm"))
    }


def test_add_prints_one_json_line_per_input_and_second_add_is_cached(capsys, store, photo_files):
    code, lines, _ = run(
        capsys, "add", str(photo_files["chelsea"]), str(photo_files["coffee"]), "--store", str(store), "--json", "--model", "toy"
    )
    assert code == 0
    assert [line["ref_id"] for line in lines] == ["chelsea", "coffee"]
    for line in lines:
        assert set(line) == {"ref_id", "image_sha256", "package_key", "model", "cached", "encode_ms", "bytes"}
        assert line["cached"] is False and line["model"] == "toy" and line["bytes"] > 0
    code, again, _ = run(capsys, "add", str(photo_files["chelsea"]), "--store", str(store), "--json", "--model", "toy")
    assert code == 0
    assert again[0]["cached"] is True and again[0]["encode_ms"] == 0
    assert again[0]["package_key"] == lines[0]["package_key"]
    code, stats, _ = run(capsys, "stats", "--store", str(store), "--json")
    assert stats[0]["references"] == 2 and stats[0]["packages"] == 2
    assert stats[0]["hits"] == 1 and stats[0]["misses"] == 2
    assert set(stats[0]) == {
        "references", "packages", "bytes", "hits", "misses", "evictions", "encode_ms_saved", "memory_bytes", "scope",
        "max_package_bytes", "quota_evictions", "quota_evicted_bytes", "pruned", "tiers", "remembered", "remembered_bytes",
        "replica",  # this process's own counts (replicas sharing a catalog)
        "prefix_hits", "prefix_misses", "prefix_bytes", "prefix_ms_saved", "corrupt", "prefix_corrupt", "load_ms", "prefix_tokens_reused", "models",
        "raw_bytes", "prefix_raw_bytes",  # the same bytes before the store's codec compressed them
    }
    assert stats[0]["raw_bytes"] >= stats[0]["bytes"] > 0
    assert set(stats[0]["tiers"]) == {"memory", "disk"}  # fastest first; "redis" between them with --redis


def test_cached_add_runs_no_encoder(store, photo_files):
    from refsight import Engine
    from refsight.backends.registry import get_backend

    toy = get_backend("toy")
    with Engine(store, model="toy") as engine:
        engine.add(photo_files["chelsea"])
        before = toy.images_encoded
        result = engine.add(photo_files["chelsea"], ref_id="chelsea-again")
    assert result.cached and toy.images_encoded == before


def test_bad_inputs_fail_alone_exit_1_and_leave_the_store_unchanged(capsys, store, photo_files, bad_image_corpus):
    run(capsys, "add", str(photo_files["chelsea"]), "--store", str(store), "--model", "toy")
    before = snapshot(store)
    bad = [str(bad_image_corpus[name]) for name in ("zero_bytes", "text_as_jpeg", "truncated_jpeg", "bomb_header_png")]
    code, lines, err = run(capsys, "add", *bad, "--store", str(store), "--json", "--model", "toy")
    assert code == 1
    assert [line["input"] for line in lines] == bad
    assert all(line["error"] for line in lines)
    assert "cannot add" in err and "zero_bytes" in err
    assert snapshot(store) == before

    # A mixed batch: the good one is stored, the bad ones reported, exit code 1.
    code, lines, _ = run(
        capsys, "add", bad[0], str(photo_files["coffee"]), bad[1], "--store", str(store), "--json", "--model", "toy"
    )
    assert code == 1
    assert [("error" in line) for line in lines] == [True, False, True]
    code, refs, _ = run(capsys, "list", "--store", str(store), "--json")
    assert sorted(r["ref_id"] for r in refs) == ["chelsea", "coffee"]


def test_id_and_metadata_show_and_remove(capsys, store, photo_files):
    code, lines, _ = run(
        capsys,
        "add",
        str(photo_files["rocket"]),
        "--id",
        "r-1",
        "--meta",
        "kind=rocket",
        "--meta",
        "n=1",
        "--store",
        str(store),
        "--json",
        "--model",
        "toy",
    )
    assert code == 0 and lines[0]["ref_id"] == "r-1"
    code, shown, _ = run(capsys, "show", "r-1", "--store", str(store), "--json")
    assert shown[0]["metadata"] == {"kind": "rocket", "n": "1"}
    assert len(shown[0]["packages"]) == 1
    code, removed, _ = run(capsys, "remove", "r-1", "--store", str(store), "--json")
    assert code == 0 and removed[0] == {"removed": "r-1"}
    code, stats, _ = run(capsys, "stats", "--store", str(store), "--json")
    assert stats[0]["references"] == 0 and stats[0]["packages"] == 0


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["show", "nope"], "not found"),
        (["remove", "../etc"], "reference id"),
        (["add", "IMG", "--id", "a/b"], "reference id"),
        (["add", "IMG", "--model", "no-such-model"], "unknown model"),
    ],
)
def test_errors_are_clean_messages_with_exit_1(capsys, store, photo_files, argv, needle):
    argv = [str(photo_files["chelsea"]) if a == "IMG" else a for a in argv]
    code, lines, err = run(capsys, *argv, "--store", str(store), "--json")
    assert code == 1
    assert needle in err and "Traceback" not in err
    assert needle in lines[-1]["error"]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["add", "IMG", "--meta", "novalue"], "KEY=VALUE"),
        (["add", "IMG", "IMG", "--id", "one"], "--id names one reference"),
        (["search"], "TEXT query or --image"),
        # The library checks the rules between arguments (one layer); its error names the argument.
        (["compare", "IMG", "--rerank", "4", "--criteria", "fur", "--model", "toy"], "--rerank: reranks a recalled "
         "shortlist: give --top-k"),
        (["compare", "IMG", "--top-k", "2", "--recall-k", "1", "--criteria", "fur", "--model", "toy"], "--recall-k: "),
        (["search", "x", "--k", "0"], "--k: must be an integer in 1..1000"),
        (["search", ""], "error: TEXT: "),  # named by the argument, not by its (empty) value
        (["search", "x", "--where", "k"], "--where 'k': expected KEY=VALUE"),
        (["gc", "--grace", "-5"], "argument --grace: '-5': give a finite number of seconds, 0 or more"),
        (["gc", "--grace", "nan"], "argument --grace: 'nan'"),
        (["gc", "--grace", "inf"], "argument --grace: 'inf'"),
    ],
)
def test_usage_errors_exit_2_with_a_clean_message(capsys, store, photo_files, argv, needle):
    argv = [str(photo_files["chelsea"]) if a == "IMG" else a for a in argv]
    try:
        code, lines, err = run(capsys, *argv, "--store", str(store), "--json")
    except SystemExit as exited:  # argparse's own usage errors (a bad --grace ...)
        code, err = exited.code, capsys.readouterr().err
    assert code == 2
    assert needle in err and "Traceback" not in err


def test_same_id_with_another_image_is_refused_and_keeps_the_first(capsys, store, photo_files):
    run(capsys, "add", str(photo_files["chelsea"]), "--id", "x", "--store", str(store), "--model", "toy")
    code, lines, _ = run(
        capsys, "add", str(photo_files["coffee"]), "--id", "x", "--store", str(store), "--json", "--model", "toy"
    )
    assert code == 1 and "error" in lines[0]
    code, shown, _ = run(capsys, "show", "x", "--store", str(store), "--json")
    assert shown[0]["image_sha256"] == json.loads(json.dumps(shown[0]))["image_sha256"]
    code, first, _ = run(
        capsys, "add", str(photo_files["chelsea"]), "--id", "x", "--store", str(store), "--json", "--model", "toy"
    )
    assert first[0]["cached"] is True and first[0]["image_sha256"] == shown[0]["image_sha256"]


def test_verify_catches_a_flipped_byte_and_repair_restores_it(capsys, store, photo_files):
    code, lines, _ = run(
        capsys, "add", str(photo_files["chelsea"]), str(photo_files["coffee"]), "--store", str(store), "--json", "--model", "toy"
    )
    key = lines[0]["package_key"]
    code, report, _ = run(capsys, "verify", "--store", str(store), "--json", "--model", "toy")
    assert code == 0 and report[0]["checked"] == 2 and report[0]["corrupt"] == []
    path = next((store / "packages").rglob(f"{key}*"))
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))
    code, report, _ = run(capsys, "verify", "--store", str(store), "--json", "--model", "toy")
    assert code == 1 and report[0]["corrupt"] == [key] and report[0]["repaired"] == 0
    code, report, _ = run(capsys, "verify", "--repair", "--store", str(store), "--json", "--model", "toy")
    assert code == 0 and report[0]["corrupt"] == [key] and report[0]["repaired"] == 1
    code, report, _ = run(capsys, "verify", "--store", str(store), "--json", "--model", "toy")
    assert code == 0 and report[0]["corrupt"] == []


def test_a_corrupt_package_is_never_served_but_re_encoded(store, photo_files):
    from refsight import Engine

    with Engine(store, model="toy") as engine:
        added = engine.add(photo_files["chelsea"])
        ref = engine.reference(added.ref_id)
        expected = engine.reference_package(ref).package.tensors["features"].clone()
    path = next((store / "packages").rglob(f"{added.package_key}*"))
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))
    with Engine(store, model="toy") as engine:  # a new engine: nothing in memory
        found = engine.reference_package(engine.reference(added.ref_id))
    assert found.cached is False
    assert found.package.tensors["features"].equal(expected)


def test_reencode_encodes_every_reference_for_another_model(capsys, store, photo_files, backend_registry):
    from refsight.backends.registry import register_backend
    from refsight.backends.toy import ToyBackend

    register_backend("toy-grid4", lambda name: ToyBackend(name, grid=4))
    run(capsys, "add", str(photo_files["chelsea"]), str(photo_files["coffee"]), "--store", str(store), "--model", "toy")
    code, lines, _ = run(capsys, "reencode", "--model", "toy-grid4", "--store", str(store), "--json")
    assert code == 0 and [line["cached"] for line in lines] == [False, False]
    code, lines, _ = run(capsys, "reencode", "--model", "toy-grid4", "--store", str(store), "--json")
    assert [line["cached"] for line in lines] == [True, True]
    code, shown, _ = run(capsys, "show", "chelsea", "--store", str(store), "--json")
    assert len(shown[0]["packages"]) == 2


def test_store_defaults_to_the_environment_variable(tmp_path, photo_files):
    env = {**os.environ, "REFSIGHT_STORE": str(tmp_path / "env-store")}
    done = subprocess.run(
        [sys.executable, "-m", "refsight.cli", "add", str(photo_files["chelsea"]), "--json", "--model", "toy"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ref_id"] == "chelsea"
    assert (tmp_path / "env-store").is_dir()


def test_compare_then_add_in_the_cli_stores_the_reference_durably(capsys, store, photo_files):
    model = ("--model", "tiny-qwen2-vl")
    run(capsys, "add", str(photo_files["coffee"]), "--id", "cup", "--store", str(store), *model)
    code, _, err = run(
        capsys, "compare", str(photo_files["chelsea"]), "--ref", "cup", "--criteria", "short fur", "--no-attributes",
        "--store", str(store), "--json", *model,
    )
    assert code == 0, err
    code, added, err = run(capsys, "add", str(photo_files["chelsea"]), "--id", "cat", "--store", str(store), "--json", *model)
    assert code == 0 and added[0]["ref_id"] == "cat", err
    code, report, _ = run(capsys, "verify", "--store", str(store), "--json")
    assert code == 0 and report[0]["checked"] == 2  # both packages on disk, sound
    code, again, _ = run(capsys, "reencode", "--store", str(store), "--json", *model)
    assert code == 0 and all(row["cached"] for row in again)


def test_verify_fresh_reports_no_drift_on_an_untouched_store(capsys, store, photo_files):
    model = ("--model", "tiny-qwen2-vl")
    run(capsys, "add", str(photo_files["chelsea"]), str(photo_files["coffee"]), "--store", str(store), *model)
    code, report, err = run(capsys, "verify", "--fresh", "2", "--store", str(store), "--json", *model)
    assert code == 0, err
    # The references were encoded together in one batch, the check encodes one at a time: float32
    # batching moves features by ~1e-8 (the measured bound in the README), never more.
    assert report[0]["ok"] is True and report[0]["max_abs_diff"] < 1e-6 and len(report[0]["packages"]) == 2


def test_a_model_named_on_the_command_line_is_loaded_with_its_own_table_not_the_default_models(
    capsys, tmp_path, photo_files, monkeypatch, backend_registry
):
    """The config file is read once and laid under the flags per model by the engine: the default
    model's ``[models."NAME"]`` table reaches that model only (it used to reach every model named)."""
    from refsight.backends.registry import register_backend
    from refsight.backends.toy import ToyBackend

    register_backend("toy-old", lambda name: ToyBackend(name, grid=4))  # takes no backend options at all
    monkeypatch.setenv("REFSIGHT_MODEL", "toy")
    store = tmp_path / "store"
    store.mkdir()
    (store / "refsight.toml").write_text('[models."toy"]\nmax_pixels = 4096\n')
    where = ("--store", str(store), "--json")

    # prune first, on a store without packages: it loads the named model to learn its fingerprint.
    code, lines, err = run(capsys, "prune", "--model", "toy-old", "--dry-run", *where)
    assert code == 0, err
    assert lines[0]["fingerprints"] == []
    code, lines, err = run(capsys, "add", str(photo_files["chelsea"]), "--model", "toy-old", *where)
    assert code == 0, err
    assert lines[0]["model"] == "toy-old"
    code, lines, err = run(capsys, "reencode", "--model", "toy-old", *where)
    assert code == 0 and lines[0]["cached"] is True, err

    # The default model does get its table (and toy takes no max_pixels, which is how it shows).
    code, _, err = run(capsys, "add", str(photo_files["coffee"]), *where)
    assert code == 1 and "max_pixels" in err, err


def test_the_cli_passes_only_the_flags_typed_and_the_file_read_once(tmp_path):
    from refsight.backends.options import BackendOptions
    from refsight.cli import build_parser
    from refsight.cli.command import backend_options, settings_of

    (tmp_path / "refsight.toml").write_text('[backend]\ndevice = "cpu"\n[models."tiny-qwen2-vl"]\nmax_pixels = 12544\n')
    parser = build_parser()

    def parsed(*argv: str):
        from refsight.cli import _resolve_store_options

        args = parser.parse_args(list(argv))
        _resolve_store_options(args)
        return args

    args = parsed("add", "x.png", "--store", str(tmp_path), "--model", "tiny-qwen2-vl", "--batch-size", "2",
                  "--processor-kwarg", "do_rescale=false")
    assert backend_options(args) == BackendOptions(batch_size=2, processor_kwargs={"do_rescale": False})
    settings = settings_of(args)
    assert settings_of(args) is settings  # read once
    assert settings.backend_options("tiny-qwen2-vl").merged(backend_options(args)) == BackendOptions(
        device="cpu", max_pixels=12544, batch_size=2, processor_kwargs={"do_rescale": False})
    other = tmp_path / "cli.toml"
    other.write_text('[backend]\ndevice = "cpu"\n')
    # The global flag also works after the command.
    args = parsed("list", "--store", str(tmp_path), "--config", str(other))
    assert backend_options(args) == BackendOptions() and settings_of(args).path == other


def test_every_argument_that_takes_a_value_is_checked_text_or_declares_its_type():
    """The front door for text: an argument of no declared type is checked as valid Unicode
    (``text_argument``), so a new argument cannot skip the check by accident."""
    import argparse

    from refsight.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in {"refsight": parser, **sub.choices}.items():
        for action in command._actions:
            if action.nargs == 0 or isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.type is not None, f"{name} {action.option_strings or action.dest}: no type"
