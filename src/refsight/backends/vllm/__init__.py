"""vLLM backend (see backend.py)."""
