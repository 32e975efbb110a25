"""``refsight serve`` without the [server] extra names the install line and exits 2."""

from __future__ import annotations

import os
import subprocess
import sys

# Runs the CLI in a fresh interpreter whose import system refuses fastapi, as on a light
# install (`pip install .`): a meta-path finder that raises for the module and its children.
_WITHOUT_FASTAPI = """
import sys

class _NoFastAPI:
    def find_spec(self, name, path=None, target=None):
        if name == "fastapi" or name.startswith("fastapi."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoFastAPI())
from refsight.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_serve_without_fastapi_prints_the_install_line_and_exits_2(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_FASTAPI, "--store", str(tmp_path / "store"), "serve", "--model", "toy"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "REFSIGHT_API_KEYS": ""},
    )
    assert result.returncode == 2, result.stderr
    assert "pip install 'refsight[server]'" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "store").exists()  # refused before anything was opened
