"""An unchanged OpenAI-SDK client against ``refsight serve``: the same R references as data URLs in every request,
a new candidate each time, and no refsight-specific call anywhere.

``ollama_client.py``'s scenario (its docstring says what each figure is) with the ``openai`` Python SDK: each
``chat.completions.create`` sends the R = 3 reference photos and one new candidate as ``image_url`` parts
holding ``data:image/png;base64,...`` URLs, then the question, with ``temperature`` 0. First request on a fresh
store, the next ``--requests`` (the references are remembered from the second on), the first request after a
restart on the same store, and the same requests on ``refsight serve --no-cache`` as the baseline.

Prints ONE JSON line, the same keys as ``ollama_client.py`` (``client`` is ``openai-python``).

    python benchmarks/openai_client.py [--model shape-qwen2-vl-2b-gguf] [--size 224] [--requests 3]
"""

from __future__ import annotations

import base64
import json
import time

from ollama_client import QUESTION, parser, run


def _data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def _ask_openai(url: str, references: list[bytes], candidate: bytes, tokens: int) -> tuple[float, str]:
    """One OpenAI chat completion: the references, then the candidate, then the question; (seconds, answer)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=1800, max_retries=0)
    model = client.models.list().data[0].id  # what an OpenAI-SDK user picks from the server's models
    content = [{"type": "image_url", "image_url": {"url": _data_url(png)}} for png in [*references, candidate]]
    began = time.perf_counter()
    reply = client.chat.completions.create(
        model=model, max_tokens=tokens, temperature=0,
        messages=[{"role": "user", "content": [*content, {"type": "text", "text": QUESTION}]}],
    )
    return time.perf_counter() - began, reply.choices[0].message.content or ""


def main(argv: list[str] | None = None) -> int:
    """Run the four paths with the ``openai`` SDK; print the one JSON line."""
    args = parser(__doc__.split("\n\n")[0]).parse_args(argv)
    print(json.dumps(run(args, _ask_openai, "openai-python")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
