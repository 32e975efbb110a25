"""The page at ``/``: plain HTML and JavaScript served by the app, no build step.

It shows the cache view (from ``/v1/stats``: hit rate, encodes avoided, encoder time saved,
KV prefix reuse, and an SVG plot of one reference's encode time against its load time), the
reference gallery (thumbnails, ids, metadata, cache state) and a form to compare a candidate
against chosen references (or the top k recalled), with a spinner and the elapsed time while it
runs, the timings per stage in ms, and the verdicts per criterion coloured with their evidence
beside the reference images. It calls the same JSON API as any client, with the API key the user
types in; without a key, thumbnails are plain ``<img src>`` (with one, ``<img>`` cannot send it,
so they are fetched and shown once loaded).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

__all__ = ["router", "page_html", "favicon_svg"]

router = APIRouter(include_in_schema=False)


@lru_cache(maxsize=1)
def page_html() -> str:
    """The page's HTML (read once from the package)."""
    return resources.files("refsight.server").joinpath("static/index.html").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def favicon_svg() -> bytes:
    """The page's icon (SVG, read once from the package)."""
    return resources.files("refsight.server").joinpath("static/favicon.svg").read_bytes()


@router.get("/", response_class=HTMLResponse)
async def index() -> HTMLResponse:
    """The gallery and comparison page."""
    # No inline event handlers or remote resources: a strict CSP costs nothing here.
    headers = {
        "Content-Security-Policy": "default-src 'self'; img-src 'self' blob: data:; style-src 'self' 'unsafe-inline'; "
        "script-src 'self' 'unsafe-inline'; connect-src 'self'",
        "X-Content-Type-Options": "nosniff",
    }
    return HTMLResponse(page_html(), headers=headers)


@router.get("/favicon.ico")
async def favicon() -> Response:
    """The page's icon, where browsers ask for it (an SVG: every current browser draws one; no 404 in the log)."""
    return Response(favicon_svg(), media_type="image/svg+xml", headers={"Cache-Control": "public, max-age=86400"})
