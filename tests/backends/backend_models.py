"""Names shared by the backend tests (a uniquely named module: see tests/image_corpus.py)."""

TINY_FAMILIES = ("tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl", "tiny-smolvlm")
