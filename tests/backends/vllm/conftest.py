"""The vLLM tests' fixtures (``vllm_python``, ``vllm_servers``) live in ``tests/vllm_servers.py``.

They are session-wide (imported by ``tests/conftest.py``) so that the benchmark smoke tests in
``tests/benchmarks`` share the servers these tests start. Here: the per-family server and the photos
on its grid, which the equivalence and uuid tests share.
"""

from __future__ import annotations

import pytest
from vllm_helpers import VLLM_FAMILIES, params_after


@pytest.fixture(scope="module", params=VLLM_FAMILIES)
def served(request, vllm_servers):
    """(tiny model name, its running server with pixels allowed); the next families' servers start meanwhile."""
    server = vllm_servers.get(request.param, 8)
    for later in params_after(request, VLLM_FAMILIES)[:vllm_servers.ahead]:
        vllm_servers.prefetch(later, 8)
    return request.param, server


@pytest.fixture(scope="module")
def grid_photos(served, photos):
    """The test photos resized onto the family's grid (multiples of patch × merge, within the pixel bounds),
    so the independent pixel path sees the very pixels refsight stores."""
    from PIL import Image

    from refsight.inputs.images import load_image

    factor = 32 if "qwen3" in served[0] else 28
    shapes = {"chelsea": (4, 3), "coffee": (3, 2), "astronaut": (3, 3), "rocket": (2, 4)}
    return {
        name: load_image(photos[name].image.resize((w * factor, h * factor), Image.BICUBIC), name=name)
        for name, (w, h) in shapes.items()
    }
