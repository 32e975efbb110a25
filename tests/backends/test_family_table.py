"""The family table (``refsight models``): every proven cell names a built-in and a test that exists,
the generic families load with no torchvision, and the counts the README promises hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from refsight.backends.family_table import NOT_SERVED, PROOFS, family_rows, proven_model_types
from refsight.backends.registry import available_models

ROOT = Path(__file__).resolve().parents[2]


def test_every_proof_names_a_registered_built_in_and_a_test_that_runs_it():
    for proof in PROOFS:
        assert proof.model in available_models(), proof
        test = ROOT / proof.test
        assert test.is_file(), proof
        # The test's folder names the built-in (its tests, conftest or model lists), or the test runs every
        # generic family (the family_checkpoints recipes).
        folder = "".join(f.read_text() for f in test.parent.glob("*.py"))
        assert proof.model in folder or "GENERIC_FAMILIES" in test.read_text(), proof


def test_the_table_holds_each_model_type_once_with_a_reason_where_it_is_not_served():
    rows = family_rows()
    assert len({r["model_type"] for r in rows}) == len(rows)
    for (model_type, runtime), why in NOT_SERVED.items():
        row = next(r for r in rows if r["model_type"] == model_type)
        assert row[runtime] == {"proven": False, "why": why}
    assert len(proven_model_types("transformers")) >= 30


def test_models_json_carries_the_family_table(capsys):
    from refsight.cli import main

    assert main(["models", "--json"]) == 0
    families = json.loads(capsys.readouterr().out)["families"]
    gemma = next(r for r in families if r["model_type"] == "gemma3")
    assert gemma["transformers"]["proven"] is True and gemma["transformers"]["test"].endswith("test_families.py")


def test_the_generic_families_load_and_encode_without_torchvision(model_cache):
    # A fresh process where torchvision cannot import (the test extras install it): every generic built-in
    # with a PIL image processor loads and encodes one image; only the torchvision-only ones are left out.
    code = (
        "import sys\n"
        "sys.modules['torchvision'] = None  # import torchvision raises ImportError, as where it is not installed\n"
        "from refsight.backends.builtin import load_tiny\n"
        "from refsight.backends.hf.classes import family_classes\n"
        "from refsight.builtin_models.family_checkpoints import FAMILY_SPECS\n"
        "from refsight.inputs.images import load_image\n"
        "from refsight.samples import load_sample\n"
        "image = load_image(load_sample('chelsea', (64, 48)))\n"
        "pil = [name for name, spec in FAMILY_SPECS.items() if family_classes(spec.model_type).image_processor]\n"
        "for name in pil:\n"
        "    load_tiny(name).encode([image])\n"
        "print('ok', len(pil), len(FAMILY_SPECS))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ok")
    _, with_pil, every = done.stdout.split()
    assert int(every) - int(with_pil) == 5  # LFM2-VL, Command A Vision, Kimi K2.5, Step 3.7, Molmo 2


def test_the_readme_carries_the_family_table():
    from refsight.backends.family_table import markdown_table

    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- families -->\n", 1)[1].split("\n<!-- /families -->", 1)[0]
    assert table == markdown_table(), "README's family table is stale: paste markdown_table()'s output"
