"""The page at ``/`` in a real headless Chromium (Debian's build, driven by Playwright; no download)."""

from __future__ import annotations

import os
import time

import pytest
from runtimes import require_module

from live_server import b64, photo_png

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def wait_until(page, expression: str, timeout_s: float = 15.0) -> None:
    """Poll a JS expression from Python until it is truthy.

    Not ``page.wait_for_function``: that evaluates its predicate with ``eval`` inside the
    page, which the page's Content-Security-Policy (no 'unsafe-eval') rightly refuses.
    ``page.evaluate`` runs through the DevTools protocol, outside the page's CSP.
    """
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {expression}")
        time.sleep(0.05)


@pytest.fixture
def browser():
    sync_api = require_module("playwright.sync_api", "pip install 'refsight[test]'")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: .ci/services installs Debian's chromium")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield browser
        browser.close()


def test_page_shows_the_gallery_and_a_verdict_table(server, browser):
    with server.client() as c:
        for name in ("chelsea", "coffee"):
            c.post("/v1/references", json={"image": b64(photo_png(name)), "id": name, "metadata": {"photo": name}})
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")

    # Gallery: both references with thumbnails (plain <img src> without keys), metadata and cache state.
    cards = page.locator("#gallery .card")
    cards.nth(1).wait_for()
    assert cards.count() == 2
    wait_until(page, "[...document.querySelectorAll('#gallery img')].every(i => i.src.includes('/thumbnail') && i.naturalWidth > 0)")
    assert "photo=chelsea" in page.locator('#gallery .card[data-ref-id="chelsea"] .meta').inner_text()
    assert page.locator('#gallery .card[data-ref-id="chelsea"] .badge').inner_text() .startswith("cached")
    assert page.locator("#random-weights").is_visible()

    # Search by text (the real offline embedder): ranked thumbnails with scores.
    page.fill("#search-text", "a cat")
    page.fill("#search-k", "2")
    page.click("#search-button")
    hits = page.locator("#search-results .hit")
    hits.nth(1).wait_for(timeout=60_000)
    assert hits.count() == 2 and hits.first.get_attribute("data-ref-id") == "chelsea"
    assert hits.first.locator(".score").inner_text().startswith("score ")
    assert page.locator("#search-embedder").inner_text().startswith("embedder: ")
    wait_until(page, "[...document.querySelectorAll('#search-results img')].every(i => i.naturalWidth > 0)")

    # Ticking the hit ticks the reference in the gallery; compare the candidate against it.
    hits.first.locator("input[type=checkbox]").check()
    assert page.locator('#gallery .card[data-ref-id="chelsea"] input.pick').is_checked()
    page.set_input_files("#candidate", files=[{"name": "candidate.png", "mimeType": "image/png",
                                               "buffer": photo_png("chelsea", flip=True)}])
    page.fill("#rubric", "striped fur\npointed ears\ngreen eyes")
    page.click("#compare-button")
    table = page.locator('#results .result[data-ref-id="chelsea"] table.verdicts')
    table.wait_for(timeout=120_000)

    assert page.locator("#error").inner_text() == ""
    rows = table.locator("tr")
    assert rows.count() == 4  # header + one row per criterion
    assert [rows.nth(i).locator("td").first.inner_text() for i in (1, 2, 3)] == ["striped fur", "pointed ears", "green eyes"]
    for i in (1, 2, 3):
        cell = rows.nth(i).locator("td.verdict")
        verdict = cell.inner_text()
        assert verdict in ("match", "mismatch", "uncertain")
        assert verdict in cell.get_attribute("class")  # coloured by verdict
        colour = cell.evaluate("c => getComputedStyle(c).backgroundColor")
        assert colour not in ("rgba(0, 0, 0, 0)", "transparent")
        assert rows.nth(i).locator("td.evidence").inner_text().strip()  # evidence shown
    assert page.locator("#results .random-label").is_visible()
    # The reference image sits beside the candidate.
    wait_until(page, "[...document.querySelectorAll('#results .pair img')].every(i => i.naturalWidth > 0)")
    assert page.locator("#results .pair img").count() == 2
    assert errors == []


def test_page_reports_api_errors_readably(make_server, browser):
    live = make_server(keys={"page-key-123456": "p"})
    page = browser.new_page()
    page.goto(live.url + "/")
    wait_until(page, "document.getElementById('error').textContent.length > 0")
    assert page.locator("#error").inner_text() == "unauthorized: missing API key"
    page.fill("#api-key", "page-key-123456")
    page.dispatch_event("#api-key", "change")
    wait_until(page, "document.getElementById('error').textContent === ''")
    # The error clears before the gallery request returns: wait for the gallery, don't race it.
    page.locator("#gallery-empty").wait_for(state="visible", timeout=10_000)


def test_page_chat_streams_an_answer_that_grows(make_server, browser):
    """The chat box reads the SSE stream as it arrives: the answer is seen growing, then equals the plain answer."""
    require_module("transformers")
    live = make_server(model="tiny-qwen2-vl")
    with live.client() as c:
        assert c.post("/v1/references", json={"image": b64(photo_png("chelsea", (56, 56))), "id": "cat"}).status_code == 201
        plain = c.post("/v1/chat/completions", json={"model": "tiny-qwen2-vl", "max_tokens": 300, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Describe it."},
                                         {"type": "image_url", "image_url": {"url": "refsight://ref/cat"}}]}]}).json()
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(live.url + "/")
    page.locator('#gallery .card[data-ref-id="cat"] .pick').check()
    # Generous bounds: the CI machine may be busy; the assertions below are about order, not speed.
    wait_until(page, "document.getElementById('model').textContent === 'model: tiny-qwen2-vl'", timeout_s=60)
    page.fill("#chat-message", "Describe it.")
    page.fill("#chat-max", "300")
    # The page records the answer's length at each change itself: a busy machine may answer one of this test's
    # polls only after the whole stream has arrived, while the page still saw it grow, piece by piece.
    page.evaluate("""() => {
        window.answerLengths = [];
        const answer = document.getElementById('chat-answer');
        new MutationObserver(() => window.answerLengths.push(answer.textContent.length))
            .observe(answer, {childList: true, subtree: true, characterData: true});
    }""")
    page.click("#chat-button")
    lengths = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        lengths.append(page.evaluate("document.getElementById('chat-answer').textContent.length"))
        if page.evaluate("document.getElementById('chat-usage').textContent !== ''"):
            break
        time.sleep(0.005)
    assert page.evaluate("document.getElementById('chat-usage').textContent !== ''"), (
        "no usage line: the stream did not finish", page.locator("#chat-error").inner_text(), lengths[-5:])
    final = page.evaluate("document.getElementById('chat-answer').textContent")  # textContent, as measured above
    seen = page.evaluate("window.answerLengths")
    growing = sorted({n for n in lengths + seen if 0 < n < len(final)})
    # Seen part-way: streamed, not one blob (a quiet machine decodes the 300 tiny-model tokens in a few polls).
    assert len(growing) >= 1, (lengths, seen, len(final))
    assert lengths == sorted(lengths) and seen == sorted(seen)
    assert page.evaluate("document.getElementById('chat-answer').textContent") == plain["choices"][0]["message"]["content"]
    assert f"answer {plain['usage']['completion_tokens']} tokens" in page.locator("#chat-usage").inner_text() and "from cached images" in page.locator("#chat-usage").inner_text()
    assert errors == []
