"""The HTTP reference is the route table's own: the checked-in page is the generated one, every route of the app has
its section, the HTTP pages link only to sections that exist, and no line of them runs over 300 characters."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "http.md"
NARRATIVE = ROOT / "docs" / "http.md"
#: The longest line the HTTP pages may have: a table row past it cannot be read or merged.
MAX_LINE = 300


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text()


def test_the_http_reference_page_is_generated_from_the_route_table(page):
    from refsight.server.http_reference import markdown

    assert page == markdown(), "stale: python -m refsight.server.http_reference > docs/reference/http.md"


def test_every_route_of_the_app_has_its_section(page, tmp_path):
    from refsight.server import ServerConfig, create_app
    from refsight.server.edge.gate import flat_routes

    app = create_app(ServerConfig(store=tmp_path / "store", model="toy", keys={}))
    table = {f"{method} {route.path}" for _, route in flat_routes(app.routes)
             for method in getattr(route, "methods", None) or () if method != "HEAD"}
    headings = set(re.findall(r"^### `([A-Z]+ \S+)`$", page, re.MULTILINE))
    assert table - headings == set(), "routes without a section: regenerate docs/reference/http.md"
    assert headings - table == set(), "sections of routes the app no longer has"


def test_the_http_pages_link_only_to_sections_that_exist(page):
    from refsight.server.http_reference import anchor

    anchors = {anchor(heading) for heading in re.findall(r"^##+ `?([^`\n]+)`?$", page, re.MULTILINE)}
    linked = set(re.findall(r"\(reference/http\.md#([\w-]+)\)", NARRATIVE.read_text()))
    assert linked, "docs/http.md links to no section of the reference"
    assert linked - anchors == set()


@pytest.mark.parametrize("path", [NARRATIVE, PAGE], ids=["http.md", "reference/http.md"])
def test_no_line_of_the_http_pages_is_over_300_characters(path):
    long = [(number, len(line)) for number, line in enumerate(path.read_text().splitlines(), 1) if len(line) > MAX_LINE]
    assert long == [], f"{path.name}: (line, characters) over {MAX_LINE}: {long}"
