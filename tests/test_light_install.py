"""A light install (``pip install .``): no server extra, no photo packages, and still a working CLI and demo.

Each test runs a fresh interpreter whose import system refuses the modules a light install
lacks (a meta-path finder that raises for them and their children).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from refsight.support.extras import install_command

pytestmark = pytest.mark.slow  # each test runs a fresh interpreter

_BLOCKER = """
import sys

BLOCKED = {blocked!r}

class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Absent())
"""
_WITHOUT_FASTAPI = _BLOCKER.format(blocked=("fastapi",)) + """
from refsight.cli import main
sys.exit(main(sys.argv[1:]))
"""
#: What the [server] extra and the dropped photo dependencies provide.
_NOT_IN_A_LIGHT_INSTALL = ("fastapi", "starlette", "uvicorn", "multipart", "prometheus_client", "skimage", "sklearn",
                           "matplotlib")


def test_serve_without_fastapi_prints_the_install_line_and_exits_2(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_FASTAPI, "--store", str(tmp_path / "store"), "serve", "--model", "toy"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "REFSIGHT_API_KEYS": ""},
    )
    assert result.returncode == 2, result.stderr
    # the line that works from this checkout (refsight is not on the index): see tests/test_extras.py
    assert install_command("server") in result.stderr and "[server]'" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "store").exists()  # refused before anything was opened


def test_the_demo_path_imports_and_finds_its_photos_without_the_extras():
    code = _BLOCKER.format(blocked=_NOT_IN_A_LIGHT_INSTALL) + """
import refsight.cli, refsight.demo, refsight.engine, refsight.report
from refsight.samples import SAMPLE_NAMES, sample_paths
from PIL import Image

paths = sample_paths()
assert list(paths) == list(SAMPLE_NAMES) and "chelsea" in paths
for path in paths.values():
    with Image.open(path) as image:
        assert max(image.size) <= 512, (path, image.size)
print(len(paths))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "7"


def test_constrained_json_runs_without_xgrammar_or_triton(model_cache):
    """The transformers backend's constrained decoder is llguidance: a CPU install pulls no GPU kernels."""
    code = _BLOCKER.format(blocked=("xgrammar", "triton")) + """
import json
from refsight.requests import GenerationRequest
from refsight.backends.builtin import load_tiny

backend = load_tiny("tiny-qwen2-vl")
schema = {"type": "object", "properties": {"verdict": {"enum": ["yes", "no"]}, "why": {"type": "string", "maxLength": 4}},
          "required": ["verdict", "why"]}
[answer] = backend.generate([GenerationRequest(["Answer in JSON."], max_new_tokens=48, json_schema=schema)])
data = json.loads(answer.text)
assert data["verdict"] in ("yes", "no") and len(data["why"]) <= 4, data
assert "xgrammar" not in sys.modules and "triton" not in sys.modules
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_demos_browse_line_names_the_server_extra_only_when_it_is_missing():
    from refsight.demo import _server_hint

    assert _server_hint() == ""  # installed here: the line says nothing more
    code = _BLOCKER.format(blocked=("fastapi",)) + """
from refsight.demo import _server_hint
print(_server_hint())
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"(it needs the server extra: {install_command('server')})"
