"""Install hints name what works from where refsight came (it is not on the package index: issue 40, item 3).

The installed distribution's ``direct_url.json`` (PEP 610) says where it came from; the hint is built
from it. The first test hands the hint for this checkout to a real pip, which must resolve it.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from refsight.support.extras import install_command, require

ROOT = Path(__file__).resolve().parents[1]


def test_the_hint_for_this_checkout_names_it_and_pip_resolves_it():
    command = install_command("server")
    words = shlex.split(command)
    assert words[:2] == ["pip", "install"] and words[-1].endswith("[server]")
    assert Path(words[-1].removesuffix("[server]")).resolve() == ROOT  # this checkout, not an index name
    # pip itself reads the line (no download: the server extra's packages are installed here).
    result = subprocess.run(
        [sys.executable, "-m", *words[:2], "--dry-run", "--no-deps", "--no-build-isolation", "--no-index", *words[2:]],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "Would install refsight" in result.stdout


def _distribution(tmp_path: Path, monkeypatch, origin: dict | None) -> str:
    """A distribution named fake-origin, installed in ``tmp_path`` with ``origin`` as its direct_url.json."""
    info = tmp_path / "fake_origin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-origin\nVersion: 1.0\n")
    if origin is not None:
        (info / "direct_url.json").write_text(json.dumps(origin))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "fake-origin"


@pytest.mark.parametrize("origin, expected", [
    ({"url": "file:///src/my%20checkout", "dir_info": {"editable": True}}, "pip install -e '/src/my checkout[ray]'"),
    ({"url": "file:///src/checkout", "dir_info": {}}, "pip install '/src/checkout[ray]'"),
    ({"url": "https://github.com/o/r.git", "vcs_info": {"vcs": "git", "commit_id": "abc"}},
     "pip install 'fake-origin[ray] @ git+https://github.com/o/r.git'"),
    ({"url": "file:///tmp/fake_origin-1.0.tar.gz", "archive_info": {}},
     "pip install 'fake-origin[ray] @ file:///tmp/fake_origin-1.0.tar.gz'"),
    (None, "pip install 'fake-origin[ray]'"),  # from an index: the index name works
])
def test_each_origin_gets_the_line_that_installs_from_it(tmp_path, monkeypatch, origin, expected):
    assert install_command("ray", distribution=_distribution(tmp_path, monkeypatch, origin)) == expected


def test_an_unreadable_origin_falls_back_to_the_index_name(tmp_path, monkeypatch):
    name = _distribution(tmp_path, monkeypatch, None)
    (tmp_path / "fake_origin-1.0.dist-info" / "direct_url.json").write_text("{not json")
    assert install_command("ray", distribution=name) == "pip install 'fake-origin[ray]'"


def test_require_names_the_purpose_and_the_install_line():
    assert require("json", "server", "anything").dumps([]) == "[]"
    with pytest.raises(ImportError, match=r"a test needs no_such_module_x, which is not installed: pip install"):
        require("no_such_module_x", "vllm", "a test")
