"""Helpers shared by the vLLM tests (a uniquely named module: see tests/image_corpus.py).

``post_chat`` and ``pixel_tokens`` talk to vLLM directly, with no refsight code:
they are the independent "vLLM's own pixel path" the cached path is compared with.
"""

from __future__ import annotations

import base64
import io
import json
import urllib.request

#: The tiny vLLM models, ordered so the session pool ends the equivalence tests with
#: tiny-qwen2-vl-vllm still running (the later files use it).
VLLM_FAMILIES = ("tiny-qwen3-vl-vllm", "tiny-qwen2.5-vl-vllm", "tiny-qwen2-vl-vllm")
MAX_NEW_TOKENS = 8


def post_chat(url: str, body: dict) -> dict:
    """POST a chat completion straight to vLLM, returning the JSON answer."""
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def served_model(url: str) -> str:
    """The id of the model a vLLM server serves."""
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as response:
        return json.loads(response.read())["data"][0]["id"]


def png_url(image) -> str:
    """A PIL image as a PNG data URL."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def pixel_tokens(url: str, row: list, max_new_tokens: int = MAX_NEW_TOKENS) -> list[int]:
    """Greedy tokens of vLLM's own pixel path: ``row`` items are text (str) or PIL images."""
    parts = [
        {"type": "text", "text": item} if isinstance(item, str) else {"type": "image_url", "image_url": {"url": png_url(item)}}
        for item in row
    ]
    body = {
        "model": served_model(url),
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": max_new_tokens,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    return post_chat(url, body)["choices"][0]["token_ids"]


def params_after(request, params) -> list:
    """The values of ``request``'s parametrized fixture this session runs after ``request.param``, in the
    session's order: none that ``-k`` left out (a server started early for them would be wasted)."""
    order = []
    for item in request.session.items:
        value = getattr(getattr(item, "callspec", None), "params", {}).get(request.fixturename)
        if value in params and value not in order:
            order.append(value)
    return order[order.index(request.param) + 1:] if request.param in order else []
