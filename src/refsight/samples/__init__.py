"""Real photos that ship inside refsight itself (package data, no download), for the demo and tests.

Seven photos whose licences allow redistribution, taken from scikit-image's and
scikit-learn's sample data, resized to at most 512 px on the long side (Lanczos, JPEG quality 95;
the horse silhouette is a 1-bit PNG). Sources and licences are in ``NOTICE.txt`` next to
the files and in the README's "Bundled photos" section.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["SAMPLE_NAMES", "sample_path", "sample_paths", "load_sample"]

#: name -> file name inside this package
_FILES: dict[str, str] = {
    "chelsea": "chelsea.jpg",  # a tabby cat
    "astronaut": "astronaut.jpg",
    "coffee": "coffee.jpg",
    "rocket": "rocket.jpg",
    "horse": "horse.png",  # a black silhouette on white
    "china": "china.jpg",
    "flower": "flower.jpg",
}
#: Every bundled photo's name, in a fixed order.
SAMPLE_NAMES = tuple(_FILES)


def sample_path(name: str) -> Path:
    """The file of one bundled photo; KeyError for an unknown name, FileNotFoundError if it is missing."""
    # A plain path: the demo and the store keep the file's own bytes (refsight is never a zip import).
    path = Path(str(resources.files(__name__).joinpath(_FILES[name])))
    if not path.is_file():
        raise FileNotFoundError(f"sample {name!r}: {path} is missing (a broken install?)")
    return path


def sample_paths() -> dict[str, Path]:
    """Every bundled photo, by name."""
    return {name: sample_path(name) for name in SAMPLE_NAMES}


def load_sample(name: str, size: tuple[int, int] | None = None):
    """One bundled photo as a fresh RGB ``PIL.Image`` (``size``: resized with bicubic filtering)."""
    from PIL import Image

    with Image.open(sample_path(name)) as image:
        rgb = image.convert("RGB")
    return rgb if size is None else rgb.resize(size, Image.Resampling.BICUBIC)
