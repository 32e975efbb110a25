"""The vLLM tests' fixtures (``vllm_python``, ``vllm_servers``) live in ``tests/vllm_servers.py``.

They are session-wide (imported by ``tests/conftest.py``) so that the benchmark smoke tests in
``tests/benchmarks`` share the servers these tests start.
"""
