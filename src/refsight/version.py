"""refsight's version, read once from the installed distribution's metadata (pyproject.toml is the one source).

Its own module so that code below the package's face (a backend recording what produced a package) can
name it without importing :mod:`refsight` itself, which would run an arrow back up.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("refsight")
except PackageNotFoundError:  # a source tree on sys.path without an install: no metadata to read
    __version__ = "0+unknown"

__all__ = ["__version__"]
