"""The CLI's output for people: tables with headers, percentages, ISO dates, model names; and
``--namespace`` on every command. ``--json`` stays the machine format (tests/test_cli.py).

The toy encoder is enough here: these tests are about what is printed.
"""

from __future__ import annotations

import importlib.util

import json
import re

import pytest

from refsight.cli import main
from refsight.support.extras import install_command
from refsight.report import format_comparison

ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def store(tmp_path, photo_files, capsys) -> str:
    store = str(tmp_path / "store")
    assert main(["add", str(photo_files["chelsea"]), str(photo_files["coffee"]), "--store", store, "--model", "toy",
                 "--meta", "species=pet", "--attributes", "none"]) == 0
    capsys.readouterr()
    return store


def test_add_prints_a_header_once_then_one_line_per_image(capsys, tmp_path, photo_files):
    code, out, _ = run(capsys, "add", str(photo_files["chelsea"]), str(photo_files["coffee"]), "--store", str(tmp_path / "s"),
                       "--model", "toy", "--attributes", "none")
    lines = out.strip().splitlines()
    assert code == 0 and lines[0].split()[:4] == ["reference", "package", "encode", "size"]
    assert lines[1].split()[:2] == ["chelsea", "encoded"] and ("KiB" in lines[1] or " B " in lines[1])
    assert len(lines) == 3


def test_list_and_show_name_the_model_and_date_the_reference(capsys, store):
    code, out, _ = run(capsys, "list", "--store", store)
    header, *rows = out.strip().splitlines()
    assert code == 0 and header.split() == ["reference", "image", "added", "(UTC)", "packages", "(model)", "metadata"]
    assert [row.split()[0] for row in rows] == ["chelsea", "coffee"]
    assert all(ISO.search(row) and "toy" in row and "species=pet" in row for row in rows)

    code, out, _ = run(capsys, "show", "chelsea", "--store", store)
    assert code == 0 and not out.lstrip().startswith("{")  # no raw JSON
    assert ISO.search(out) and "species=pet" in out
    assert re.search(r"^\s+toy\s+[0-9a-f]{64}\s+[0-9a-f]{16}$", out, re.M)  # packages by model name, not digest

    code, out, _ = run(capsys, "show", "chelsea", "--store", store, "--json")  # the machine format is unchanged
    data = json.loads(out)
    assert isinstance(data["created_at"], float) and all(len(k) == 64 for k in data["packages"])


def test_stats_reads_as_figures_with_a_hit_rate(capsys, store, photo_files):
    assert main(["add", str(photo_files["chelsea"]), "--store", store, "--model", "toy", "--attributes", "none"]) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "stats", "--store", store)
    assert code == 0 and "{" not in out and "'" not in out  # no dict reprs
    assert re.search(r"package cache\s+hit rate 33\.3% \(1 hits, 2 encodes\)", out)
    assert re.search(r"encodes avoided\s+1: .* of encoder time saved, for .* spent loading packages", out)
    # no per-tier table: a `stats` process has served nothing, its per-process tier counts were all zeros
    assert "KV prefix cache" in out and "this process" not in out and not re.search(r"^\s+tier\s+hits", out, re.M)
    assert re.search(r"^\s+toy\s+1\s+[\d.]+ (ms|s)\s+[\d.]+ (ms|s)$", out, re.M)  # per model: encode against load
    assert not re.search(r"\b\d+\.0\b(?! ?(ms|KiB|MiB|GiB|%|s))", out)  # counts are integers, not floats


def test_models_say_backend_weights_and_what_they_need_and_json_gives_stored_fingerprints(capsys, store):
    code, out, _ = run(capsys, "models", "--store", store)
    header, *rows = out.strip().splitlines()
    assert code == 0 and header.split()[:4] == ["model", "backend", "weights", "needs"]
    by_name = {row.split()[0]: row for row in rows if row and not row.startswith("Random")}
    assert "transformers" in by_name["tiny-qwen2-vl"] and "random" in by_name["tiny-qwen2-vl"]
    # the install line names this checkout (refsight is not on the index): see tests/test_extras.py
    # What a model still needs: the install line where its runtime is missing, else nothing more.
    llama_needs = "llama-cpp-python is installed" if importlib.util.find_spec("llama_cpp") else install_command("llamacpp")
    assert "llama.cpp" in by_name["tiny-qwen2-vl-gguf"] and llama_needs in by_name["tiny-qwen2-vl-gguf"]
    assert "vllm-env" in by_name["tiny-qwen2-vl-vllm"] or "the vLLM venv is built" in by_name["tiny-qwen2-vl-vllm"]

    code, out, _ = run(capsys, "models", "--store", store, "--json")
    data = json.loads(out)
    assert "toy" in data["models"] and data["default"]  # as before
    toy = next(m for m in data["details"] if m["name"] == "toy")
    assert [f["packages"] for f in toy["fingerprints"]] == [2]
    assert len(toy["fingerprints"][0]["fingerprint_digest"]) == 64


def test_models_opens_no_store_where_there_is_none(capsys, tmp_path):
    assert main(["models", "--store", str(tmp_path / "none"), "--json"]) == 0
    assert not (tmp_path / "none").exists()
    capsys.readouterr()


def test_verdicts_show_no_confidence_for_uncertain_and_random_evidence_as_such():
    criteria = [
        {"criterion": "is a cat", "verdict": "match", "confidence": 0.91, "source": "attributes", "evidence": "tabby 0.4"},
        {"criterion": "short fur", "verdict": "uncertain", "confidence": 1.0, "source": "vlm", "evidence": "\ufffdx\ufffd"},
    ]
    data = {"model": "tiny", "random_weights": True, "timings_ms": {"judge": 1234.5, "total": 1300.0},
            "results": [{"ref_id": "chelsea", "score": 0.5, "reference_cached": True, "criteria": criteria}]}
    text = format_comparison(data)
    uncertain = next(line for line in text.splitlines() if "short fur" in line)
    assert "1.00" not in uncertain and "(random text)" in uncertain and "\ufffd" not in text
    assert "tabby 0.4" in text and "0.91" in text  # real-weight evidence and confidence stay
    assert "judge 1.2 s" in text


def test_namespace_on_every_command_keeps_references_apart(capsys, store, photo_files):
    assert main(["add", str(photo_files["coffee"]), "--id", "mug", "--store", store, "--model", "toy",
                 "--namespace", "acme", "--attributes", "none"]) == 0
    capsys.readouterr()
    _, out, _ = run(capsys, "list", "--store", store, "--json", "--namespace", "acme")
    assert [json.loads(line)["ref_id"] for line in out.splitlines()] == ["mug"]
    _, out, _ = run(capsys, "--namespace", "acme", "list", "--store", store, "--json")  # before the command too
    assert [json.loads(line)["ref_id"] for line in out.splitlines()] == ["mug"]
    _, out, _ = run(capsys, "list", "--store", store, "--json")  # the default namespace: the two added first
    assert [json.loads(line)["ref_id"] for line in out.splitlines()] == ["chelsea", "coffee"]
    code, _, err = run(capsys, "show", "mug", "--store", store)
    assert code == 1 and "mug" in err
    _, out, _ = run(capsys, "stats", "--store", store, "--json", "--namespace", "acme")
    assert json.loads(out)["references"] == 1
    assert main(["remove", "mug", "--store", store, "--namespace", "acme"]) == 0
    capsys.readouterr()


def test_a_bad_namespace_is_a_usage_error(capsys, store):
    with pytest.raises(SystemExit) as exited:
        main(["list", "--store", store, "--namespace", "../x"])
    assert exited.value.code == 2 and "namespace" in capsys.readouterr().err
