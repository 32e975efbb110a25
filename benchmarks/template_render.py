"""What rendering a chat template in the bounded renderer costs per render: one JSON line.

Every chat renders its template (llama.cpp: the prompt, its prefix and the empty-prompt check). The bounded renderer
(``refsight.backends.templates``) runs each render in a worker process under a deadline; this times the same render
there and, as a baseline in the same run, in this process in Jinja's sandbox as refsight rendered before:

- ``short``: one user turn in ChatML (the built-in GGUFs' template);
- ``long``: 20 turns of 2,000 characters each.

Figures: ``<case>_inprocess_us`` and ``<case>_worker_us`` (medians over ``--renders``, each render a conversation
not rendered before: a round trip to the worker), ``<case>_overhead_us`` (their difference) and ``<case>_ratio``;
``<case>_again_us``, the same render again (remembered: no round trip, as a chat's checks and generation render
its prompt more than once); ``worker_start_ms``, the first render's extra time (a worker started, once per process).

    python benchmarks/template_render.py [--renders 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _context(turns: int, chars: int, serial: int = 0) -> dict[str, Any]:
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": ("word " * chars)[:chars]} for i in range(turns)]
    messages[-1]["content"] += f" #{serial}"  # a conversation of its own
    return {"messages": messages, "add_generation_prompt": True, "bos_token": "", "eos_token": ""}


def _median_us(render: Callable[[int], str], n: int) -> float:
    times = []
    for i in range(n):
        began = time.perf_counter()
        render(i)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--renders", type=int, default=2000)
    args = parser.parse_args()
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from refsight.backends.templates import render

    began = time.perf_counter()
    render(CHATML, _context(1, 2), flavour="llama.cpp")
    figures: dict[str, Any] = {"worker_start_ms": round((time.perf_counter() - began) * 1000, 1)}
    compiled = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(CHATML)
    for case, turns, chars in (("short", 1, 12), ("long", 20, 2000)):
        contexts = [_context(turns, chars, i) for i in range(args.renders)]
        inprocess = _median_us(lambda i: compiled.render(**contexts[i]), args.renders)
        worker = _median_us(lambda i: render(CHATML, contexts[i], flavour="llama.cpp"), args.renders)
        again = _median_us(lambda i: render(CHATML, contexts[-1], flavour="llama.cpp"), args.renders)
        assert render(CHATML, contexts[0], flavour="llama.cpp") == compiled.render(**contexts[0])
        figures.update({
            f"{case}_inprocess_us": round(inprocess, 1), f"{case}_worker_us": round(worker, 1),
            f"{case}_overhead_us": round(worker - inprocess, 1), f"{case}_ratio": round(worker / inprocess, 2),
            f"{case}_again_us": round(again, 1),
        })
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
