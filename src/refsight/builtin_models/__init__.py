"""The built-in offline models: random-weight checkpoints built here, from recipes, with no download.

``tiny-*`` models are small (hidden 64, 2 layers) so tests run in seconds; ``shape-*`` models have
a real model's vision tower and projector at full size, so benchmarks measure real encode times.
Each is built once into the model cache (``$REFSIGHT_MODEL_CACHE``) and then loaded by the
backends exactly like a user's checkpoint or GGUF. This room builds folders and knows nothing of
the backends; they reach it through one seam, :mod:`refsight.backends.builtin`.

- :mod:`.checkpoints`: the Qwen and SmolVLM checkpoints (:class:`~.checkpoints.ModelSpec`), the one
  build-into-cache of every built-in, and :func:`~.checkpoints.ensure_model_dir`;
- :mod:`.family_checkpoints`: the checkpoints of the other families, from the recipes of
  :mod:`.family_recipes`, :mod:`.hybrid_recipes`, :mod:`.kin_recipes`, :mod:`.torchvision_recipes`
  and :mod:`.codebook_recipes`;
- :mod:`.processor_files`, :mod:`.tokenizer`, :mod:`.shape_vocab`: chat templates and processor
  settings, the tokenizers trained in-process, the real-shape vocabulary;
- :mod:`.gguf`, :mod:`.gguf_families`, :mod:`.gguf_quantized`, :mod:`.gguf_converter`: the same
  checkpoints converted (and quantized) with llama.cpp's own tools;
- :mod:`.vllm_qwen`, :mod:`.vllm_families`: the variants vLLM's CPU runtime accepts.
"""
