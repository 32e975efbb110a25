"""A text ``refsight search`` loads no VLM, no transformers and no image model (issue 40, item 4).

Its query is text: it needs the retrieval embedder's text half (all-MiniLM-L6-v2 in plain torch) and
the index. Each check runs a fresh interpreter whose import system refuses transformers (a meta-path
finder that raises for it), so loading any VLM or ``AutoModel`` fails the command. How long it takes
is measured by ``benchmarks/cli_startup.py``, not asserted here.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from refsight.cli import main

pytestmark = pytest.mark.slow  # the CLI in a fresh interpreter

_WITHOUT_TRANSFORMERS = """
import sys

class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "transformers":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Absent())
from refsight.cli import main
code = main(sys.argv[1:])
from refsight.embedders import efficientnet_lite
assert efficientnet_lite.load_efficientnet_lite0.cache_info().currsize == 0, "the image model was loaded"
sys.exit(code)
"""


def test_a_text_search_loads_no_vlm_no_transformers_and_no_image_model(tmp_path, capsys):
    from refsight.samples import sample_paths

    store = str(tmp_path / "store")
    photos = sample_paths()
    assert main(["--store", store, "add", str(photos["chelsea"]), str(photos["coffee"]), "--model", "toy",
                 "--attributes", "none"]) == 0
    assert main(["--store", store, "index"]) == 0  # the references' vectors: embedded once, ever
    capsys.readouterr()
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TRANSFORMERS, "--store", store, "search", "a cat", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert '"chelsea"' in result.stdout
