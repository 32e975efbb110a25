"""One chat from Open WebUI's real page in a headless Chromium (Debian's build, driven by Playwright): log in,
pick the model, type a message, wait for the reply bubble, and fail with what the bubble shows if it is an
error. The page attaches its built-in tools and runs its tasks as it does for every user.
"""

from __future__ import annotations

import re
import time

from open_webui_app import ADMIN, Session

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MESSAGE = "Describe a cat in one short sentence."
#: A chat's page (``/c/ID``), its id the group.
CHAT_URL = re.compile(r"/c/([^/?#]+)")


def page_chat(url: str, session: Session, model_id: str) -> None:
    """The chat from the page; raises with the bubble's text when it shows an error or no reply."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            log_in(page, url)
            pick_model(page, model_id)
            page.locator("#chat-input").click()
            page.keyboard.type(MESSAGE)
            page.keyboard.press("Enter")
            bubble = page.locator(".chat-assistant").last
            bubble.wait_for(timeout=60_000)
            chat_id = wait_for_chat_url(page)
            saved = session.saved_chat(chat_id)
            shown = bubble.inner_text().strip()
        finally:
            browser.close()
    reply = saved["chat"]["history"]["messages"][saved["chat"]["history"]["currentId"]]
    if reply.get("error"):
        raise RuntimeError(f"the reply bubble shows an error: {shown!r}")
    if not reply.get("done") or not shown:
        raise RuntimeError(f"no reply in the bubble: {shown!r}")


def log_in(page, url: str) -> None:
    """The sign-in form, then the release notes a fresh Open WebUI shows once."""
    page.goto(f"{url}/auth")
    page.fill('input[name="email"]', ADMIN["email"])
    page.fill('input[name="password"]', ADMIN["password"])
    page.click('button[type="submit"]')
    page.wait_for_selector("#chat-input", timeout=60_000)
    notes = page.get_by_role("button", name="Okay, Let's Go!")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not notes.is_visible():
        time.sleep(0.1)
    if notes.is_visible():
        notes.click()


def pick_model(page, model_id: str) -> None:
    """The model selector beside the input, and the model's entry in its list."""
    page.locator("[id^=model-selector][id$=-button]").first.click()
    page.locator("#model-selector-list").get_by_text(model_id, exact=True).click()


def wait_for_chat_url(page, timeout_s: float = 60) -> str:
    """The new chat's id, once the page has moved to ``/c/ID`` (Open WebUI 0.12 replaces the URL when its
    ``/api/chat/completions`` answers with the chat it created).

    Playwright's own wait, not a loop over ``page.url``: the sync API takes in the browser's events only
    inside its own calls, so ``page.url`` read between ``time.sleep``s stays at the URL of the last call.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_url(CHAT_URL, timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        raise RuntimeError(f"the page never opened the new chat in {timeout_s:g} s (still at {page.url})") from None
    return CHAT_URL.search(page.url).group(1)
