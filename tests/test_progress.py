"""Long work shows progress on a terminal: a compare's stage and elapsed time, erased when it ends;
nothing at all when progress is off (``--json``, ``--quiet``, not a terminal)."""

from __future__ import annotations

import io

from refsight import Engine
from refsight.cli import build_parser
from refsight.cli.command import shows_progress
from refsight.samples import sample_paths
from refsight.support.timing import StageTicker, StageTimer


def test_the_ticker_shows_each_stage_with_the_elapsed_time_and_erases_its_line():
    stream = io.StringIO()
    with StageTicker("compare", enabled=True, stream=stream, interval_s=0.05) as ticker:
        timer = StageTimer(on_start=ticker.stage)
        with timer("recall"):
            pass
        with timer("candidate_encode"):
            pass
    out = stream.getvalue()
    assert "compare: recall … 0.0 s" in out and "compare: candidate encode …" in out
    assert out.endswith("\r\x1b[K")  # the status line is gone once the work ends


def test_a_disabled_ticker_writes_nothing():
    stream = io.StringIO()
    with StageTicker("compare", enabled=False, stream=stream) as ticker:
        ticker.stage("judge")
    assert stream.getvalue() == ""


def test_a_compare_with_progress_names_its_stages_on_stderr(tmp_path, capsys):
    photos = sample_paths()
    with Engine(tmp_path / "store", model="toy", progress=True) as engine:
        list(engine.add_many([photos["chelsea"], photos["coffee"]]))
        capsys.readouterr()
        engine.compare(photos["chelsea"], criteria="short fur", top_k=1, attributes=())
    err = capsys.readouterr().err
    assert "compare: recall …" in err and "compare: judge …" in err


def test_json_and_quiet_turn_progress_off():
    parser = build_parser()
    for argv in (["list", "--json"], ["list", "--quiet"], ["--quiet", "list"]):
        args = parser.parse_args(argv)
        args.json, args.quiet = getattr(args, "json", False), getattr(args, "quiet", False)
        assert not shows_progress(args)
