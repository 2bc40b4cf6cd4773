"""``GET /ui``: a page served by ``videorouter serve`` itself that asks a video a question and
shows what the router kept (on by default, off with ``--no-ui``).

    GET /ui         the page (no key: it holds no data; it asks for the key when the server has
                    one and sends it on every call)
    GET /ui/media   the videos of the media directory a file:// URL may name (the API key, as
                    /v1; confined exactly as a request's file:// URL: MediaStore.listing)

The page is one self-contained file (vr_runtime.html: the same renderer as ``ask --html``) and
talks to ``POST /v1/chat/completions`` as any OpenAI client would, streaming, with the opt-in
field ``videorouter_thumbnails``; no other way in is added. Its Content-Security-Policy lets it
run its own script and style only, load images from ``data:`` URLs only and connect to this
server only.
"""
from __future__ import annotations

import functools
import json

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..html import ui_page
from .errors import key_error

router = APIRouter()

# At most this many videos in the listing (a media directory of thousands is still one page).
LISTING_LIMIT = 1000


@functools.lru_cache(maxsize=2)
def _page(key_required: bool):
    html, csp = ui_page(key_required)
    return html.encode("utf-8"), csp


@router.get("/ui")
async def ui(request: Request):
    body, csp = _page(request.app.state.api_key is not None)
    return Response(body, media_type="text/html; charset=utf-8", headers={
        "content-security-policy": csp, "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer", "x-frame-options": "DENY", "cache-control": "no-store"})


@router.get("/ui/media")
async def media_listing(request: Request):
    state = request.app.state
    if state.api_key is not None:   # the same key and the same 401 as /v1
        key_error(request.headers.get("authorization", ""), state.api_key)
    media = state.get_engine().media
    videos, truncated = media.listing(LISTING_LIMIT)
    body = {"videos": videos, "truncated": truncated,
            "max_video_mb": media.config.max_video_bytes / 2**20,
            "max_body_mb": state.max_body_bytes / 2**20}
    return Response(json.dumps(body), media_type="application/json",
                    headers={"cache-control": "no-store"})
