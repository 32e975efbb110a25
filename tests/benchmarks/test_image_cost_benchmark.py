"""image_cost.py runs end to end at a tiny size: both settings measured, their ratios beside them."""

from __future__ import annotations

from benchmark_runner import assert_keys, run_benchmark

SETTING = ("max_pixels", "load_ms", "encode_ms", "chat_ms", "image_tokens", "package_bytes", "first_request_ms",
           "encode_ms_each", "random_weights")


def test_image_cost_at_a_tiny_size(model_cache):
    # tiny-smolvlm's default tiling is 2×2 tiles of 32² and a global one; the "demo" setting here is one tile.
    figures = run_benchmark("image_cost.py", "--models", "tiny-smolvlm", "--photos", "chelsea", "--demo-pixels", "1024")
    assert_keys(figures, "photos", "demo_pixels", "cores", "models", "random_weights")
    model = figures["models"]["tiny-smolvlm"]
    for setting in ("demo", "default"):
        assert_keys(model[setting], *SETTING)
    assert model["demo"]["max_pixels"] == 1024 and model["default"]["max_pixels"] is None
    assert model["default"]["image_tokens"] > model["demo"]["image_tokens"] > 0  # more tiles, more tokens
    assert model["default_over_demo"]["image_tokens"] > 1 and figures["random_weights"] is True
