"""Model backends: the only code that touches a model runtime.

Backends load lazily through :mod:`refsight.backends.registry`; importing this
package imports no torch.
"""

from .base import Backend, Generation, Segment
from .options import BackendOptions
from .registry import available_models, get_backend, register_backend

__all__ = [
    "Backend",
    "BackendOptions",
    "Generation",
    "Segment",
    "available_models",
    "get_backend",
    "register_backend",
]
