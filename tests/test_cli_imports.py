"""The commands that need no model import no torch and no transformers (checked in a fresh process,
where nothing else could have imported them first). ``benchmarks/cli_startup.py`` measures their time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from refsight.cli import main
from refsight.samples import sample_paths

#: Each model-free command, as a user types it (``REF``: a reference in the store).
MODEL_FREE = (["list"], ["show", "REF"], ["stats"], ["models"], ["prune", "--dry-run"], ["prune"], ["gc"], ["--help"],
              ["remove", "REF"])  # last: the others read the reference

_PROBE = """
import json, sys
from refsight.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exited:  # --help
    code = exited.code
heavy = sorted(m for m in ("torch", "transformers", "llama_cpp", "ray", "fastapi") if m in sys.modules)
print(json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("imports")
    assert main(["add", str(sample_paths()["chelsea"]), "--store", str(root / "store"), "--model", "toy", "--attributes", "none",
                 "--json"]) == 0
    return str(root / "store")


@pytest.mark.parametrize("argv", MODEL_FREE, ids=lambda argv: " ".join(argv))
def test_a_model_free_command_imports_no_model_runtime(store, argv):
    args = [a.replace("REF", "chelsea") for a in argv] + ["--store", store]
    result = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=300)
    report = json.loads(result.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, result.stderr[-2000:]
    assert report["heavy"] == [], f"refsight {' '.join(argv)} imported {report['heavy']}"
