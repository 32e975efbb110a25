"""The vLLM backend: ``--model vllm:http://HOST:PORT``.

refsight encodes (its HF backend with the same weights) and stores packages as
always; a vLLM OpenAI server generates from them as ``image_embeds``. Modules, one
concern each (none imports torch at import time, so ``refsight --help`` stays light):

- :mod:`.backend`: :class:`~.backend.VLLMBackend`, the transport (the base class checks and prepares);
- :mod:`.messages`: the OpenAI request bodies and what is read back from the answers;
- :mod:`.loading`: the ``vllm:`` registry factory (the encoder for the served model, checked);
- :mod:`.client`: JSON over HTTP to the server; failures become refsight errors;
- :mod:`.env`: builds (or reuses) the separate vLLM venv (``refsight vllm-env``);
- :mod:`.serve`: starts and stops a server from it (``refsight vllm-serve``);
- :mod:`.cli`: the two commands, hooked into ``refsight.cli``.
"""
