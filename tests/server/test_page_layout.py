"""The page's layout in a real headless Chromium, asserted on element boxes (issue 40, item 4).

Each field's label sits above it, the forms use the page's width, no placeholder is cut off, and
``/favicon.ico`` is an icon, not a 404. A screenshot of the page is saved beside the test's files
(and in ``$REFSIGHT_TEST_ARTIFACTS`` when set) for a person to look at; the assertions read geometry
from the DOM, never pixels, so fonts and rendering differences between machines do not matter.
"""

from __future__ import annotations

import pytest
from test_page import browser, wait_until  # noqa: F401  (the browser fixture)
from test_page_cache_view import screenshot

pytestmark = pytest.mark.slow  # drives a real headless Chromium

# Every textarea's label text: the bottom of its first line against the top of the field it names.
_LABELS_ABOVE = """() => [...document.querySelectorAll('form > label')].filter(l => l.querySelector('textarea')).map(l => {
  const range = document.createRange();
  range.selectNodeContents(l.firstChild);
  return {id: l.querySelector('textarea').id, text_bottom: range.getBoundingClientRect().bottom,
          field_top: l.querySelector('textarea').getBoundingClientRect().top};
})"""
# Each form's width against its section's content width, and each textarea's against its form's.
_WIDTHS = """() => [...document.querySelectorAll('section form')].map(f => {
  const section = f.closest('section'), style = getComputedStyle(section);
  const inner = section.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  const area = f.querySelector('textarea');
  return {id: f.id, form: f.getBoundingClientRect().width, section: inner,
          textarea: area ? area.getBoundingClientRect().width : null};
})"""
# Each placeholder line's width in the field's own font, against the room the field gives it.
_PLACEHOLDERS = """() => {
  const context = document.createElement('canvas').getContext('2d');
  return [...document.querySelectorAll('input[placeholder], textarea[placeholder]')].map(el => {
    const style = getComputedStyle(el);
    context.font = `${style.fontStyle} ${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
    const text = Math.max(...el.placeholder.split('\\n').map(line => context.measureText(line).width));
    const room = el.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    return {id: el.id, text, room};
  });
}"""


def test_labels_sit_above_their_fields_forms_use_the_width_and_placeholders_fit(server, browser, tmp_path):  # noqa: F811
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    wait_until(page, "document.querySelector('#model').textContent.includes('toy')")
    shot = screenshot(page, tmp_path, "page-layout")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    labels = page.evaluate(_LABELS_ABOVE)
    assert {label["id"] for label in labels} == {"rubric", "chat-message"}
    for label in labels:
        assert label["text_bottom"] <= label["field_top"] + 0.5, label  # the label's text above, not beside or under
    for form in page.evaluate(_WIDTHS):
        assert form["form"] >= 0.95 * form["section"], form  # the page's width, not a 640 px column
        if form["textarea"] is not None:
            assert form["textarea"] >= 0.95 * form["form"], form
    placeholders = page.evaluate(_PLACEHOLDERS)
    assert {"add-meta", "query", "rubric", "search-text"} <= {p["id"] for p in placeholders}
    for field in placeholders:
        assert field["text"] <= field["room"], field  # the whole placeholder shows
    assert not errors


def test_the_favicon_is_an_icon_and_the_page_links_it(server, browser):  # noqa: F811
    with server.client() as c:
        icon = c.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert icon.content.startswith(b"<svg") and b"</svg>" in icon.content
    page = browser.new_page()
    page.goto(server.url + "/")
    assert page.evaluate("document.querySelector('link[rel=icon]').href") == server.url + "/favicon.ico"
    # The browser draws it: an <img> of it decodes (an SVG Chromium could not read would not).
    page.evaluate("""() => { const i = new Image(); i.id = 'icon-probe'; i.src = '/favicon.ico';
                           document.body.append(i); }""")
    wait_until(page, "document.getElementById('icon-probe').complete")
    assert page.evaluate("document.getElementById('icon-probe').naturalWidth") > 0
