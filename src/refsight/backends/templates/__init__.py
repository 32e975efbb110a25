"""Chat templates rendered under bounds: every render of every backend goes through :func:`render`, in a worker
process, under a deadline, with its output and values bounded.

A chat template comes from the operator (``--chat-template``, ``--chat-template-file``) or from a model file
(a GGUF's ``tokenizer.chat_template``, a checkpoint's); either may be hostile or broken. Nothing of it runs in
the server's process: :mod:`.workers` hands each render to a worker process running :mod:`.sandbox` and waits on
its pipe (a model thread or a light thread waits; the event loop never does). Per render:

- a deadline, :data:`RENDER_DEADLINE_S`: past it the worker is killed (and replaced at the next render), and the
  render is an :class:`~refsight.errors.InvalidInputError` naming ``chat_template``;
- a bound on the output and on every value the template makes: :func:`render_limit`, the characters of what it is
  given times :data:`LIMIT_PER_INPUT_CHAR`, plus :data:`LIMIT_BASE` (no render may cost more than its input
  justifies); integers past :data:`~.sandbox.MAX_INT_BITS` bits;
- the worker's address space, :data:`RENDER_MEMORY_BYTES`: what no rule sizes beforehand fails there;
- compiling happens there too, where nothing is folded at compile time (:mod:`.sandbox`).

A chat renders the same prompt more than once (its checks, then its generation): the last renders are remembered
(:data:`MEMO_ENTRIES`, at most :data:`MEMO_CHARS` characters, none longer than :data:`LIMIT_BASE`) by their whole
request, so the same render again is no round trip to a worker. A template that reads the clock or draws at random
(``strftime_now``, ``random``) is never remembered: each of its renders runs.

Each backend renders in its **flavour** (:data:`~.sandbox.FLAVOURS`): ``llama.cpp`` for a GGUF, ``transformers``
for a checkpoint (``apply_chat_template``'s environment), each byte-identical to what that path rendered in-process.
:func:`stop_renders` kills every worker at once (a server's SIGTERM: a render in progress fails then, so shutting
down never waits on a template).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from ...errors import InvalidInputError
from .workers import RenderFailed, RenderPool, encode

__all__ = [
    "TemplateRaised", "LIMIT_BASE", "LIMIT_PER_INPUT_CHAR", "MEMO_CHARS", "MEMO_ENTRIES", "RENDER_DEADLINE_S",
    "RENDER_MEMORY_BYTES", "RENDER_WORKERS", "render", "render_limit", "render_workers", "stop_renders",
]

#: Seconds a render may take in its worker (renders of real templates take milliseconds).
RENDER_DEADLINE_S = 2.0
#: The address space of a render worker (Python and Jinja take about 25 MB of it): the workers together stay within
#: the 1 GB a request or flood may add to the server's memory.
RENDER_MEMORY_BYTES = 256 << 20
#: Render workers at most, started as renders need them (each about 20 MB resident).
RENDER_WORKERS = 4
#: Characters any render may write (or make as one value) whatever its input...
LIMIT_BASE = 1 << 20
#: ...and this many more per character it is given (a template may repeat its messages a few times).
LIMIT_PER_INPUT_CHAR = 8
#: Renders remembered, and the characters they may hold together.
MEMO_ENTRIES, MEMO_CHARS = 32, 4 << 20
#: Names in a template that make its renders differ from one call to the next: those are never remembered.
_UNREPEATABLE = ("strftime_now", "random")

_pool = RenderPool(RENDER_WORKERS, RENDER_DEADLINE_S, RENDER_MEMORY_BYTES)
_memo: OrderedDict[bytes, dict[str, Any]] = OrderedDict()
_memo_lock = threading.Lock()


class TemplateRaised(InvalidInputError):
    """The template itself refused to render (``raise_exception``, an undefined name ...): the conversation it was
    given, not a bound, is what it refused."""


def render_limit(context: Any) -> int:
    """The bound of a render given ``context``: :data:`LIMIT_BASE` plus :data:`LIMIT_PER_INPUT_CHAR` per character."""
    return LIMIT_BASE + LIMIT_PER_INPUT_CHAR * _chars(context)


def _chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(_chars(k) + _chars(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(_chars(v) for v in value)
    return 0


def render(template: str, context: Mapping[str, Any], *, flavour: str) -> str:
    """``template`` rendered with ``context`` (plain data: strings, numbers, booleans, lists, dicts) in
    ``flavour``'s environment; InvalidInputError naming ``chat_template`` when it does not compile, raises, breaks
    a bound or the deadline."""
    return _ask({"flavour": flavour, "template": template, "context": dict(context), "limit": render_limit(context)})


def _ask(request: dict[str, Any]) -> str:
    body = encode(request)
    key = hashlib.blake2b(body, digest_size=16).digest()
    with _memo_lock:
        reply = _memo.get(key)
        if reply is not None:
            _memo.move_to_end(key)
    if reply is None:
        reply = _render_in_worker(body)
        if not any(name in request["template"] for name in _UNREPEATABLE):
            _remember(key, reply)
    if "error" in reply:
        raise (TemplateRaised if reply.get("raised") else InvalidInputError)("chat_template", reply["error"])
    return reply["text"]


def _render_in_worker(body: bytes) -> dict[str, Any]:
    """The worker's reply (its text, or the template's error); InvalidInputError past the deadline or when the
    worker failed (neither is remembered: another try may differ)."""
    try:
        return _pool.call(body)
    except RenderFailed as e:
        if str(e) == "timeout":
            raise InvalidInputError("chat_template", f"did not finish rendering within {RENDER_DEADLINE_S:g} s "
                                    "(the deadline of a render)") from None
        raise InvalidInputError("chat_template", str(e)) from None


def _remember(key: bytes, reply: dict[str, Any]) -> None:
    if _chars_of(reply) > LIMIT_BASE:
        return
    with _memo_lock:
        _memo[key] = reply
        while len(_memo) > MEMO_ENTRIES or sum(map(_chars_of, _memo.values())) > MEMO_CHARS:
            _memo.popitem(last=False)


def _chars_of(reply: dict[str, Any]) -> int:
    return len(reply.get("text") or reply.get("error") or "")


def render_workers() -> int:
    """How many render worker processes run now."""
    return _pool.workers


def stop_renders() -> None:
    """Kill every render worker now; renders in progress and from now on fail (a process that is shutting down)."""
    _pool.stop()
