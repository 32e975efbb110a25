"""Real photos that ship inside installed packages (no download), for the demo and tests.

scikit-image's bundled data (chelsea the tabby cat, astronaut, coffee, rocket,
motorcycle, horse), scikit-learn's sample images (china, flower) and matplotlib's
sample data (grace_hopper). Paths point at the original files, so a reference
keeps the photographer's bytes.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SAMPLE_NAMES", "sample_path", "sample_paths"]

#: name -> (package, path inside the package)
_SAMPLES: dict[str, tuple[str, str]] = {
    "chelsea": ("skimage", "data/chelsea.png"),
    "astronaut": ("skimage", "data/astronaut.png"),
    "coffee": ("skimage", "data/coffee.png"),
    "rocket": ("skimage", "data/rocket.jpg"),
    "motorcycle": ("skimage", "data/motorcycle_left.png"),
    "horse": ("skimage", "data/horse.png"),
    "china": ("sklearn", "datasets/images/china.jpg"),
    "flower": ("sklearn", "datasets/images/flower.jpg"),
    "grace_hopper": ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
}
SAMPLE_NAMES = tuple(_SAMPLES)


def sample_path(name: str) -> Path:
    """The file of one bundled photo; KeyError for an unknown name, FileNotFoundError if its package is missing."""
    import importlib.util

    package, inner = _SAMPLES[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"sample {name!r} needs the {package} package")
    path = Path(list(spec.submodule_search_locations)[0]) / inner
    if not path.is_file():
        raise FileNotFoundError(f"sample {name!r}: {path} is missing")
    return path


def sample_paths() -> dict[str, Path]:
    """Every bundled photo that is present, by name."""
    found = {}
    for name in SAMPLE_NAMES:
        try:
            found[name] = sample_path(name)
        except FileNotFoundError:
            continue
    return found
