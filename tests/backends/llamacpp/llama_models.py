"""Names shared by the llama.cpp backend tests (a uniquely named module, like backend_models.py)."""

#: The built-in GGUF families every property is proven on.
GGUF_FAMILIES = ("tiny-qwen2-vl-gguf", "tiny-qwen2.5-vl-gguf", "tiny-smolvlm-gguf")

#: The chat prompt of each family, written here independently of refsight's template code.
PROMPTS = {
    "tiny-qwen2-vl-gguf": "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
    "tiny-qwen2.5-vl-gguf": "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
    "tiny-smolvlm-gguf": "<|im_start|>User: {}<end_of_utterance>\nAssistant:",
}


def require_llama_cpp() -> None:
    """Skip the calling test module (fail it in strict mode, ``CI=true``) when llama-cpp-python is not installed."""
    from runtimes import require_module

    require_module("llama_cpp.mtmd_cpp", "pip install 'refsight[llamacpp]'")
