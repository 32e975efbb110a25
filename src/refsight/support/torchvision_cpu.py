"""torchvision's CUDA wheel beside a CPU torch: the one registration that lets it import.

PyPI's torchvision wheels are CUDA builds. Beside torch ``+cpu`` their
``torchvision._meta_registrations`` module fails on import ("operator torchvision::nms does not
exist": it registers meta kernels of CUDA-built operators), and once torchvision is installed
transformers imports it with every model module, so nothing of transformers would load. An empty
module registered under that name first lets the rest of torchvision import; its transforms run
on the CPU. :func:`register_stand_in` does that when refsight is imported, before anything of
transformers is, in the caller's process and in every process refsight starts (workers, converters).
It changes nothing when torchvision is not installed, is imported already, or torch and torchvision
are built alike (whose meta registrations work and are kept).

Families whose only image processor needs torchvision (LFM2-VL, Cohere2-Vision ...) are then
served with it (:func:`torchvision_imports`); where it does not import, their load error names
the package to install (:func:`missing_torchvision`), not "unsupported".
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from typing import Any

__all__ = ["STAND_IN", "register_stand_in", "torchvision_imports", "install_line", "missing_torchvision"]

#: The module that cannot import beside a CPU torch, replaced by an empty one.
STAND_IN = "torchvision._meta_registrations"


def register_stand_in() -> bool:
    """Register the empty :data:`STAND_IN` where it is needed (see the module docstring); whether it is in place."""
    if STAND_IN in sys.modules:
        return True
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is None:
        return False
    from importlib import metadata  # only with torchvision installed: it costs `import refsight` ~30 ms

    try:
        # PyTorch's own CPU wheels say "+cpu"; PyPI's torchvision (a CUDA build) says nothing.
        needed = metadata.version("torch").endswith("+cpu") and not metadata.version("torchvision").endswith("+cpu")
    except metadata.PackageNotFoundError:
        return False
    if needed:
        sys.modules[STAND_IN] = types.ModuleType(STAND_IN)
    return needed


@functools.cache
def torchvision_imports() -> bool:
    """Whether torchvision imports in this process (its transforms are what torchvision-only image processors run)."""
    register_stand_in()
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure: its image processors cannot run here
        return False
    return True


def install_line() -> str:
    """The pip line for the torchvision release built for the torch installed here (torch 2.N pairs with 0.N+15)."""
    from importlib import metadata

    try:
        major, minor = metadata.version("torch").split("+")[0].split(".")[:2]
    except (metadata.PackageNotFoundError, ValueError):
        return "pip install torchvision"
    return f"pip install torchvision=={int(major) - 2}.{int(minor) + 15}.*" if major == "2" else "pip install torchvision"


def missing_torchvision(classes: Any) -> str:
    """Why a family (its :class:`~refsight.backends.hf.classes.FamilyClasses`) cannot load for want of torchvision, naming the
    package to install; "" when it has a PIL image processor, or torchvision imports."""
    if classes.image_processor is not None or classes.torchvision_image_processor is None:
        return ""
    return (f"its only image processor, {classes.torchvision_image_processor}, needs torchvision, which does not import "
            f"here: {install_line()}")
