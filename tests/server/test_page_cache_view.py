"""The page's cache view, thumbnails, timings and spinner, in a real headless Chromium.

Screenshots go to the test's tmp dir, and to ``$REFSIGHT_TEST_ARTIFACTS`` when it is set (CI keeps
that folder), so a person can look at what the assertions checked.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

from test_page import browser, wait_until  # noqa: F401  (the browser fixture)

from live_server import b64, photo_png


def screenshot(page, tmp_path: Path, name: str, selector: str | None = None) -> Path:
    """Save a screenshot (the whole page, or one element) and copy it to the artifacts folder, if any."""
    path = tmp_path / f"{name}.png"
    (page.locator(selector) if selector else page).screenshot(path=str(path))
    artifacts = os.environ.get("REFSIGHT_TEST_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(artifacts) / path.name)
    return path


def test_the_cache_view_shows_what_the_cache_saved_with_a_plot(server, browser, tmp_path):  # noqa: F811
    with server.client() as c:
        for name in ("chelsea", "coffee"):
            assert c.post("/v1/references", json={"image": b64(photo_png(name)), "id": name}).status_code == 201
        # Adding the same image again is a cache hit: an encode avoided, a load instead.
        c.post("/v1/references", json={"image": b64(photo_png("chelsea")), "id": "chelsea"})
        stats = c.get("/v1/stats").json()
    assert stats["hits"] >= 1
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/")
    wait_until(page, "document.getElementById('cache-hit-rate').textContent !== '–'")

    hit_rate = page.locator("#cache-hit-rate").inner_text()
    assert re.fullmatch(r"\d+\.\d%", hit_rate)
    assert hit_rate == f"{100 * stats['hits'] / (stats['hits'] + stats['misses']):.1f}%"
    assert page.locator("#cache-encodes-avoided").inner_text() == str(stats["hits"])
    assert re.fullmatch(r"[\d.]+ (ms|s)", page.locator("#cache-time-saved").inner_text())
    assert page.locator("#cache-prefix-reuse").inner_text().endswith("tokens")
    # The plot: per model, an encode bar and a load bar, each labelled with its time.
    group = page.locator('#cache-plot g.model[data-model="toy"]')
    assert group.count() == 1 and [m["model"] for m in stats["models"]] == ["toy"]
    encode, load = group.locator("rect.encode"), group.locator("rect.load")
    assert encode.count() == 1 and load.count() == 1
    assert float(encode.get_attribute("width")) > 0 and float(load.get_attribute("width")) > 0
    assert "per reference" in page.locator("#cache-plot").text_content()

    # Thumbnails are plain <img src> on a server without keys: no script fetch, no blob URL.
    wait_until(page, "[...document.querySelectorAll('#gallery img')].every(i => i.complete && i.naturalWidth > 0)")
    assert all("/thumbnail?size=256" in src for src in page.eval_on_selector_all("#gallery img", "els => els.map(e => e.src)"))
    shot = screenshot(page, tmp_path, "cache-view", "#cache-view")
    assert shot.stat().st_size > 1000
    screenshot(page, tmp_path, "page")
    assert errors == []


def test_a_compare_shows_a_spinner_with_elapsed_time_then_timings_per_stage(server, browser, tmp_path):  # noqa: F811
    with server.client() as c:
        assert c.post("/v1/references", json={"image": b64(photo_png("chelsea")), "id": "chelsea"}).status_code == 201
    page = browser.new_page()
    page.goto(server.url + "/")
    page.locator('#gallery .card[data-ref-id="chelsea"] input.pick').check()
    page.set_input_files("#candidate", files=[{"name": "candidate.png", "mimeType": "image/png",
                                               "buffer": photo_png("chelsea", flip=True)}])
    page.fill("#rubric", "striped fur\npointed ears")
    # Hold the compare request a moment, so the spinner is seen while it runs.
    page.route("**/v1/compare", lambda route: (page.wait_for_timeout(1500), route.continue_()))
    # The model's calls take a while, so the stage the server is in can be seen on the page.
    backend = server.service.engine.backend()
    for name in ("encode", "generate"):
        original = getattr(backend, name)
        setattr(backend, name, lambda *a, _original=original, **k: (time.sleep(1.5), _original(*a, **k))[1])
    page.click("#compare-button")
    page.locator("#busy").wait_for(state="visible", timeout=10_000)
    wait_until(page, "/\\d+\\.\\d s$/.test(document.getElementById('busy-elapsed').textContent)")
    # The stage comes from the server (GET /v1/compare/progress/TOKEN), not a list the page guesses.
    wait_until(page, "document.getElementById('busy-stage').textContent.startsWith('server: ')")
    assert page.locator("#busy-stage").inner_text().removeprefix("server: ").rstrip("… ") in {
        "starting", "recall", "prefilter", "rerank", "candidate encode", "reference load", "attributes", "judge"}
    page.locator("#results table.timings").wait_for(timeout=120_000)
    assert page.locator("#busy").is_hidden()
    rows = page.locator("#results table.timings tr")
    stages = [rows.nth(i).locator("td").first.inner_text() for i in range(rows.count())]
    assert "total" in stages and "judge" in stages
    assert all(re.fullmatch(r"[\d.]+ (ms|s)|\d+ min \d+ s", rows.nth(i).locator("td.ms").inner_text())
               for i in range(rows.count()))
    assert "{" not in page.locator("#results").inner_text()  # no raw JSON blob
    screenshot(page, tmp_path, "compare-timings", "#results")


def test_with_a_key_thumbnails_are_plain_images_on_first_paint_and_the_cache_view_says_its_counters_are_not_the_tenants(
    make_server, browser, tmp_path,  # noqa: F811
):
    key = "page-key-1234567890"
    live = make_server(keys={key: "alpha"})
    with live.client(key) as c:
        assert c.post("/v1/references", json={"image": b64(photo_png("chelsea")), "id": "chelsea"}).status_code == 201
    page = browser.new_page()
    page.goto(live.url + "/")
    page.fill("#api-key", key)
    page.dispatch_event("#api-key", "change")
    page.locator('#gallery .card[data-ref-id="chelsea"]').wait_for(timeout=30_000)
    # <img> cannot send the key: the page's SameSite=Strict image cookie carries it, so a thumbnail is a
    # plain <img src> (no fetch, no blob URL), loaded like any image; and on a reload, with the first paint.
    loaded = ("[...document.querySelectorAll('#gallery img')].every(i => i.src.includes('/thumbnail?size=256') && "
              "i.complete && i.naturalWidth > 0)")
    wait_until(page, loaded)
    page.reload()
    page.locator('#gallery .card[data-ref-id="chelsea"]').wait_for(timeout=30_000)
    wait_until(page, loaded)
    page.locator("#cache-note").wait_for(state="visible", timeout=30_000)
    assert "store-wide" in page.locator("#cache-note").inner_text()
    screenshot(page, tmp_path, "cache-view-tenant", "#cache-view")
