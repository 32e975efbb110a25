"""The docs site builds strictly, its CLI reference is the parser's own, and every environment variable is documented."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_cli_reference_page_is_generated_from_the_parser():
    from refsight.cli.reference import markdown

    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert page == markdown(), "stale: python -m refsight.cli.reference > docs/reference/cli.md"


def test_every_environment_variable_the_code_reads_is_documented():
    from refsight.cli.reference import ENVIRONMENT, INTERNAL

    read = set()
    for path in (ROOT / "src" / "refsight").rglob("*.py"):
        read |= set(re.findall(r"REFSIGHT_[A-Z0-9_]+", path.read_text()))
    assert read - set(INTERNAL) == set(ENVIRONMENT)


@pytest.mark.slow  # runs mkdocs in a subprocess
def test_mkdocs_builds_the_site_strictly(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()


@pytest.mark.slow  # runs mkdocs in a subprocess
def test_a_broken_anchor_fails_the_strict_build(tmp_path):
    """The site's own validation settings, on two pages where one links to a heading the other lacks."""
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().split("\nplugins:", 1)[0])
    assert config["strict"] is True and config["validation"]["anchors"] == "warn"
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the fields](other.md#no-such-heading).\n")
    (docs / "other.md").write_text("# Other\n\n## Fields\n")
    site = {"site_name": "t", "docs_dir": "docs", "strict": True, "validation": config["validation"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(site))
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "-d", str(tmp_path / "site")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode != 0 and "no-such-heading" in done.stderr
