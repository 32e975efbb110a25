"""The install line for an optional extra, written for how this copy of refsight was installed.

refsight is not on the package index, so ``pip install 'refsight[llamacpp]'`` fails for
everyone. pip records where an installed distribution came from (PEP 610's
``direct_url.json``): a checkout (``file://`` directory, editable or not), a VCS URL or an
archive. :func:`install_command` reads it and writes the line that works from there:
``pip install -e '/path/to/checkout[llamacpp]'`` for an editable checkout,
``pip install '/path/to/checkout[llamacpp]'`` for a plain one, ``pip install
'refsight[llamacpp] @ git+https://...'`` for a VCS install; only a distribution without the
file (one from an index) gets ``pip install 'refsight[llamacpp]'``.
"""

from __future__ import annotations

import importlib
import json
import shlex
from importlib import metadata
from types import ModuleType
from urllib.parse import unquote, urlparse

__all__ = ["LLAMA_CPP_PYTHON_VERSION", "install_command", "require"]

#: The llama-cpp-python release the ``llamacpp`` extra pins, whose runtime and converter refsight is tested with.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"

_DISTRIBUTION = "refsight"


def _origin(distribution: str) -> dict | None:
    """The distribution's ``direct_url.json`` as a dict; None when it has none or it is unreadable.

    Every copy named ``distribution`` on ``sys.path`` is asked, not only the first: a source tree
    put on the path (its in-tree ``*.egg-info`` has no origin record) must not hide the install.
    """
    for found in metadata.distributions(name=distribution):
        try:
            text = found.read_text("direct_url.json")
            origin = json.loads(text) if text else None
        except (ValueError, OSError):
            continue
        if isinstance(origin, dict) and isinstance(origin.get("url"), str):
            return origin
    return None


def install_command(extra: str, *, distribution: str = _DISTRIBUTION) -> str:
    """The ``pip install`` line that adds ``extra`` to the refsight the user has (see the module doc)."""
    origin = _origin(distribution)
    if origin is None:
        return f"pip install {shlex.quote(f'{distribution}[{extra}]')}"
    url = origin["url"]
    parsed = urlparse(url)
    if parsed.scheme == "file" and "dir_info" in origin:
        target = shlex.quote(f"{unquote(parsed.path)}[{extra}]")
        editable = bool((origin.get("dir_info") or {}).get("editable"))
        return f"pip install -e {target}" if editable else f"pip install {target}"
    if "vcs_info" in origin:
        vcs = origin["vcs_info"].get("vcs", "git") if isinstance(origin["vcs_info"], dict) else "git"
        url = f"{vcs}+{url}"
    return f"pip install {shlex.quote(f'{distribution}[{extra}] @ {url}')}"


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """``module`` imported, or ImportError saying ``purpose`` needs it and the line that installs ``extra``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{purpose} needs {module}, which is not installed: {install_command(extra)}") from e
