"""Chat templates cannot end, stall or bloat the server (issue 60, groups 2 and 3), through a real ``refsight serve``.

Before: ``--chat-template '{% if false %}x{% endif %}'`` (or the same in a GGUF) and any chat aborted the process
(llama.cpp's ``GGML_ASSERT(logits != nullptr)``); a template looping 1e10 times never answered, kept a core busy
after the client left, hung ``/apply-template`` and the token counts, and SIGTERM did not end the server in 40 s;
``('%' ~ n*999999999 ~ 's') % 'x'`` and ``'x' * (n*999999999)`` took the server's RSS from 110 MB to 16-20 GB;
``{{ 'x' * 10**9 }}`` folded to a 3.9 GB peak at start, and the server started.

Now a template a GGUF carries (this module's server: one, its triggers by word) renders in a bounded worker: an
empty prompt is a 400 naming ``messages`` (or ``prompt``) on every route, before llama.cpp sees it; a render past
its deadline or bounds is a 400 naming ``chat_template`` within the deadline, while other requests are served; the
server's memory does not move; SIGTERM ends it at once mid-render. A template that fails at start is one line.
"""

from __future__ import annotations

import base64
import io
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from hardening_helpers import ServeProcess, run_bounded
from runtimes import require_module

require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")

pytestmark = pytest.mark.slow  # a llama.cpp server in a subprocess, and start-ups that are refused

MODEL = "tiny-qwen2-vl-gguf"
DEADLINE_S = 2.0  # refsight.backends.templates.RENDER_DEADLINE_S
LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
#: ChatML, unless the last message holds a trigger word: then the template turns hostile in one way.
TEMPLATE = (
    "{%- set text = messages[-1]['content'] -%}"
    "{%- if 'boom' in text %}" + LOOP + "{% endif -%}"
    "{%- if 'pad' in text %}{{ ('%' ~ (messages|length)*999999999 ~ 's') % 'x' }}{% endif -%}"
    "{%- if 'many' in text %}{{ 'x' * ((messages|length) * 999999999) }}{% endif -%}"
    "{%- if 'double' in text %}{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}{{ ns.s|length }}{% endif -%}"
    "{%- if 'quiet' not in text %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    "{% endif -%}"
)


def _messages(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _png() -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 40, 40)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _status_mb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {key}")


def _cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and its children now (the render workers are its children)."""
    import os

    def one(p: int) -> float:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    total = one(pid)
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            total += one(int(child))
        except OSError:
            pass  # ended meanwhile
    return total


@pytest.fixture(scope="module")
def gguf(tmp_path_factory, model_cache):
    """The built-in GGUF pair, its language model carrying :data:`TEMPLATE` as its own chat template."""
    from refsight.builtin_models.gguf import ensure_gguf
    from refsight.builtin_models.gguf_converter import with_chat_template

    model, mmproj = ensure_gguf(MODEL)
    return with_chat_template(model, TEMPLATE, tmp_path_factory.mktemp("gguf") / "model.gguf"), mmproj


@pytest.fixture(scope="module")
def server(gguf, tmp_path_factory):
    model, mmproj = gguf
    process = ServeProcess(tmp_path_factory.mktemp("store"), "--mmproj", str(mmproj), "--workers", "2",
                           "--alias", MODEL, model=str(model)).wait_ready(timeout=300)
    yield process
    process.stop()


def _assert_400(reply: httpx.Response, named: str) -> str:
    assert reply.status_code == 400, (reply.status_code, reply.text[:300])
    text = reply.text
    assert f"{named}:" in text, text[:300]
    return text


def test_a_prompt_that_is_nothing_to_generate_from_is_a_400_on_every_route(server):
    quiet = _messages("quiet please")
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.post("/v1/chat/completions", json={"messages": _messages("hi"), "max_tokens": 2}).status_code == 200
        assert c.post("/v1/references", json={"image": _png(), "id": "red"}).status_code == 201
        space = c.post("/tokenize", json={"content": " \n"}).json()["tokens"]
        before = _status_mb(server.process.pid, "VmRSS")
        for path, body, named in [
            ("/v1/chat/completions", {"messages": quiet, "max_tokens": 2}, "messages"),
            ("/v1/chat/completions", {"messages": quiet, "max_tokens": 2, "stream": True}, "messages"),
            ("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": quiet}, "messages"),
            ("/api/chat", {"model": MODEL, "messages": quiet, "stream": False}, "messages"),
            ("/api/generate", {"model": MODEL, "prompt": "quiet please", "stream": False}, "messages"),
            ("/apply-template", {"messages": quiet}, "messages"),
            ("/v1/messages/count_tokens", {"model": MODEL, "messages": quiet}, "messages"),
            ("/v1/chat/completions/input_tokens", {"messages": quiet}, "messages"),
            # The judge renders the rubric in the template: the template drops the images, and says so.
            ("/v1/compare", {"candidate": _png(), "criteria": "quiet colour", "ref_ids": ["red"], "force_vlm": True},
             "messages"),
            ("/completion", {"prompt": "", "n_predict": 2}, "prompt"),
            ("/completion", {"prompt": " \n\t", "n_predict": 2}, "prompt"),
            ("/completion", {"prompt": space, "n_predict": 2}, "prompt"),  # token ids whose text is whitespace
            ("/v1/completions", {"prompt": "  ", "max_tokens": 2}, "prompt"),
        ]:
            _assert_400(c.post(path, json=body), named)
        assert c.get("/health").status_code == 200
        assert c.post("/v1/chat/completions", json={"messages": _messages("hi"), "max_tokens": 2}).status_code == 200
    assert _status_mb(server.process.pid, "VmRSS") - before < 50


def test_a_render_past_its_deadline_is_a_400_naming_the_template_while_the_rest_is_served(server):
    boom = _messages("boom")
    latencies: list[float] = []
    stop = threading.Event()

    def poll_health() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            while not stop.is_set():
                began = time.monotonic()
                assert c.get("/health").status_code == 200
                latencies.append(time.monotonic() - began)
                stop.wait(0.05)

    poller = threading.Thread(target=poll_health)
    poller.start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as c, ThreadPoolExecutor(4) as pool:
            began = time.monotonic()
            # One model worker on the hostile chat; /apply-template holds none (a render has bounds of its own).
            hostile = [pool.submit(c.post, path, json=body) for path, body in [
                ("/v1/chat/completions", {"messages": boom, "max_tokens": 2}),
                ("/apply-template", {"messages": boom}),
            ]]
            time.sleep(0.3)
            served = c.post("/v1/chat/completions", json={"messages": _messages("hi"), "max_tokens": 2})
            served_after = time.monotonic() - began
            replies = [f.result() for f in hostile]
            answered = time.monotonic() - began
            # A count decodes and tokenizes: model work, a worker's turn; each answered within the deadline.
            counted = c.post("/v1/chat/completions/input_tokens", json={"messages": boom})
            counted_after = time.monotonic() - began - answered
            messages = c.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": boom})
    finally:
        stop.set()
        poller.join()
    for reply in [*replies, counted, messages]:
        assert "did not finish rendering within" in _assert_400(reply, "chat_template")
    assert served.status_code == 200 and served_after < DEADLINE_S, served_after  # not queued behind the loops
    assert answered < 3 * DEADLINE_S and counted_after < DEADLINE_S + 1.5, (answered, counted_after)
    assert max(latencies) < 1.0, f"/health took up to {max(latencies):.2f} s during the renders"
    spent = _cpu_seconds(server.process.pid)
    time.sleep(1.0)
    assert _cpu_seconds(server.process.pid) - spent < 0.3  # no render is left running
    print(f"hostile renders answered in {answered:.2f} s; /health max {max(latencies) * 1000:.0f} ms")


def test_values_past_the_bounds_are_refused_and_cost_the_server_no_memory(server):
    before = server.reset_peak()
    with httpx.Client(base_url=server.url, timeout=60) as c:
        for word in ("pad", "many", "double"):
            for path, body in (("/v1/chat/completions", {"messages": _messages(word), "max_tokens": 2}),
                               ("/apply-template", {"messages": _messages(word)})):
                began = time.monotonic()
                _assert_400(c.post(path, json=body), "chat_template")
                assert time.monotonic() - began < DEADLINE_S + 1.5
    after, peak = _status_mb(server.process.pid, "VmRSS"), server.peak_rss_mb()
    print(f"server RSS {before:.0f} -> {after:.0f} MB, peak {peak:.0f} MB")
    assert after - before < 50 and peak - before < 100, (before, after, peak)


def test_sigterm_ends_the_server_at_once_mid_render(server):
    """Last in the module: it ends the module's server. The render in progress fails at once (its worker killed), so
    the server does not wait for the deadline (1.5 s more) before it exits."""
    answered: list[tuple[httpx.Response, float]] = []

    def render() -> None:
        reply = httpx.post(f"{server.url}/apply-template", json={"messages": _messages("boom")}, timeout=30)
        answered.append((reply, time.monotonic()))

    thread = threading.Thread(target=render)
    thread.start()
    time.sleep(0.5)  # the render is under way in its worker
    began = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=30)
    exited = time.monotonic() - began
    thread.join(timeout=10)
    (reply, at), = answered
    assert "shutting down" in _assert_400(reply, "chat_template")
    assert at - began < 1.0 and exited < 5.0, (at - began, exited)  # before: no exit within 40 s
    print(f"SIGTERM mid-render: the render failed after {at - began:.2f} s, the server exited after {exited:.2f} s")


@pytest.mark.parametrize(("flag", "template", "said"), [
    ("--chat-template", "{% if false %}x{% endif %}", "--chat-template: renders an empty prompt"),
    ("--chat-template-file", "{{ 'x' * 10**9 }}", "--chat-template-file {path}: '*' would make a value past"),
])
def test_a_given_template_that_fails_at_start_is_one_line_and_exit_2(tmp_path, model_cache, flag, template, said):
    from refsight.builtin_models.gguf import ensure_gguf

    ensure_gguf(MODEL)
    path = tmp_path / "t.jinja"
    path.write_text(template)
    given = str(path) if flag == "--chat-template-file" else template
    run = run_bounded(["--store", str(tmp_path / "store"), "serve", MODEL, "--port", "0", flag, given], timeout=120)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and lines[-1].startswith("refsight: error: " + said.format(path=path)), run.stderr
    assert not [line for line in lines if "Traceback" in line]
    assert run.max_rss_mb < 600, run.max_rss_mb  # the fold was 3.9 GB: nothing of it ran in the server


def test_a_gguf_whose_own_template_renders_nothing_is_refused_at_load_in_one_line(tmp_path, model_cache):
    from refsight.builtin_models.gguf import ensure_gguf
    from refsight.builtin_models.gguf_converter import with_chat_template

    model, mmproj = ensure_gguf(MODEL)
    empty = with_chat_template(model, "{% if false %}x{% endif %}", tmp_path / "empty.gguf")
    run = run_bounded(["--store", str(tmp_path / "store"), "serve", str(empty), "--mmproj", str(mmproj),
                       "--port", "0"], timeout=120)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 1 and "its own chat template renders an empty prompt" in last, run.stderr
    assert "--chat-template-file" in last and "Traceback" not in run.stderr
