"""The recipes of the built-in checkpoints whose image features are codebook tokens (data only).

Emu3 (``emu3``): no vision tower and projector. A VQ-VAE quantizes an image into a grid of
codebook codes, ``config.vocabulary_map`` maps each code to a ``<|visual token NNNNNN|>`` token of
the text vocabulary (plus ``<|extra_200|>`` closing each row), and the image's features are those
tokens' rows of the language model's own embedding table. The tiny one: text hidden 64, 2 layers;
a VQ-VAE of 32 channels and a 32-code codebook, downsampling 8 px to a code as Emu3's processor
assumes; every image resized onto one 32 px square, 20 tokens (see :data:`EMU3`).

Keyword arguments of a :class:`~refsight.builtin_models.family_checkpoints.FamilySpec`, as in
:mod:`.family_recipes`.
"""

from __future__ import annotations

# ruff: noqa: E501  (chat templates read best on one line each)

from .family_recipes import _TEXT, _images_then_texts

__all__ = ["EMU3"]

#: The tiny VQ-VAE's codebook size: one ``<|visual token NNNNNN|>`` token per code.
_EMU3_CODES = 32
_EMU3_VISUAL = tuple(f"<|visual token{i:06d}|>" for i in range(_EMU3_CODES))

# Emu3-Chat-hf: "USER: <image>...<prompt> ASSISTANT:" (llava-hf's layout: a turn's images first, then its
# texts), no BOS token: Emu3Processor's prepare_inputs_layout prepends it to every text (its __call__ passes
# add_special_tokens on nested in text_kwargs, so the hook never sees it off), and refsight's prompts go through
# the same hook (GenericBackend._processor_layout). The processor expands <image> to
# <|image start|>H*W<|image token|>, H·(W+1) <image> tokens, then <|extra_201|><|image end|>; the features fill
# the <image> tokens with H rows of W visual tokens' embeddings, each row closed by <|extra_200|>'s.
EMU3 = dict(
    model_type="emu3",
    special_tokens=("<|endoftext|>", "<|extra_203|>", "<|extra_204|>", "<image>", "<|image start|>", "<|image end|>",
                    "<|image token|>", "<|extra_200|>", "<|extra_201|>", *_EMU3_VISUAL),
    eos="<|extra_204|>", pad="<|endoftext|>", bos="<|extra_203|>",
    named_tokens={"image_token": "<image>", "boi_token": "<|image start|>", "eoi_token": "<|image end|>",
                  "image_wrapper_token": "<|image token|>", "eof_token": "<|extra_201|>"},
    chat_template=("{% for m in messages %}{% if m['role'] != 'system' %}{{ m['role'].upper() + ': ' }}{% endif %}"
                   + _images_then_texts("<image>", "{{ c['text'] + ' ' }}", string="{{ m['content'] + ' ' }}")
                   + "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"),
    config=dict(
        text_config=dict(_TEXT),
        # Four levels (2³ = 8 px a code, Emu3Processor's fixed downsample ratio) of 32 channels (GroupNorm's 32
        # groups); the images are repeated to the 4 frames the temporal convolutions reduce to one.
        vq_config=dict(codebook_size=_EMU3_CODES, embed_dim=4, latent_channels=4, base_channels=32,
                       channel_multiplier=[1, 1, 1, 1], num_res_blocks=1, attn_resolutions=[], hidden_size=32,
                       num_attention_heads=1, temporal_downsample_factor=4),
        vocabulary_map={"<image>": "token:<image>", "<|extra_200|>": "token:<|extra_200|>",
                        **{t: f"token:{t}" for t in _EMU3_VISUAL}},
    ),
    # Every image of aspect ratio under 4:1 onto one 32 px square (smart-resize to multiples of 32 px, at most
    # 32² px): 4x4 codes, 4 rows of 4 visual tokens and <|extra_200|>, 20 tokens. One size for every image on
    # purpose: Emu3's image processor pads a call's images to its largest, and the VQ-VAE's group norms, middle
    # attention and convolutions see the padding, so an image's codes in a batch of other sizes are not its codes
    # alone (measured at 8 px granularity, 24x32 and 32x24 px photos padded to 32x32: 4-6 of their 12 codes
    # differ). refsight encodes each image alone; the proof's pixel path batches every image of the prompts.
    image_processor=dict(spatial_factor=32, min_pixels=32 * 32, max_pixels=32 * 32, image_mean=[0.5] * 3, image_std=[0.5] * 3),
)
