"""The app's own routes, one router per group: references, judging (compare, search), monitoring (health, stats,
metrics), and one module per dialect: OpenAI's chat completions and models (:mod:`.openai`) and text completions
(:mod:`.completions`), llama-server's native endpoints (:mod:`.llama_server`; :mod:`.llama_text`: its tokenizer and chat template), Ollama's native API (:mod:`.ollama`:
chat and generate; :mod:`.ollama_models`: the model endpoints; :mod:`.ollama_bodies`: their request bodies) and
Anthropic's Messages API (:mod:`.anthropic`); the retrieval stage on its own: embeddings (:mod:`.embeddings`, OpenAI's,
vLLM's and llama-server's; :mod:`.ollama_embed`, Ollama's) and rerank and score (:mod:`.rerank`).

Each module holds a module-level ``router``; its routes declare what they need
(:mod:`refsight.server.deps`) instead of closing over it. The page (:mod:`.page`) is a router of the same kind,
included when the web UI is on.
"""

from __future__ import annotations

from .anthropic import router as anthropic_router
from .completions import router as completions_router
from .embeddings import router as embeddings_router
from .judging import router as judging_router
from .llama_server import router as llama_server_router
from .llama_text import router as llama_text_router
from .ollama import router as ollama_router
from .ollama_embed import router as ollama_embed_router
from .ollama_models import router as ollama_models_router
from .openai import router as openai_router
from .references import router as references_router
from .rerank import router as rerank_router
from .monitoring import router as monitoring_router

__all__ = ["ROUTERS"]

#: In the order the app includes them.
ROUTERS = (
    monitoring_router, references_router, judging_router, llama_server_router, llama_text_router, completions_router,
    ollama_router, ollama_models_router, anthropic_router, openai_router, embeddings_router, ollama_embed_router,
    rerank_router,
)
