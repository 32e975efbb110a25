"""llama.cpp's own converter, run from the llama-cpp-python sdist refsight is tested with.

``convert_hf_to_gguf.py`` and its ``conversion/`` and ``gguf-py/`` packages are unpacked once
from the sdist (fetched with ``pip download`` into the model cache, or taken from
``$REFSIGHT_LLAMA_CPP_SRC``) and run in a separate process per conversion. Both the Qwen and
SmolVLM built-ins (:mod:`.gguf`) and the generic families (:mod:`.gguf_families`) convert through
:func:`convert`; the file names of a built GGUF pair live here so neither imports the other.
:func:`with_chat_template` copies a built GGUF with another ``tokenizer.chat_template`` (gguf-py's own
``gguf_new_metadata.py``), as a downloaded model may carry any template.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ..support.environment import llama_cpp_source, model_cache_dir
from ..errors import ModelLoadError
from ..support.extras import LLAMA_CPP_PYTHON_VERSION

__all__ = ["MMPROJ_FILE", "MODEL_FILE", "convert", "converter_dir", "with_chat_template"]
#: The language model and the vision projector of a built GGUF pair.
MODEL_FILE = "model.gguf"
MMPROJ_FILE = "mmproj.gguf"


# Runs the converter with the unknown pre-tokenizer hash mapped to a known name. A
# separate process: the converter parses sys.argv and configures logging globally.
_CONVERT = """
import os, runpy, sys
import refsight  # its import lets PyPI's torchvision import beside a CPU torch (refsight.support.torchvision_cpu)
src = os.environ["REFSIGHT_CONVERTER_DIR"]
sys.path[:0] = [src, os.path.join(src, "gguf-py")]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: os.environ["REFSIGHT_PRE_TOKENIZER"]
# Qwen's set_vocab tries SentencePiece first and falls back to BPE on FileNotFoundError;
# without the sentencepiece package it fails on the import instead. Our tokenizers are BPE.
_sp = base.TextModel._set_vocab_sentencepiece
def _set_vocab_sentencepiece(self, *args, **kwargs):
    if not (self.dir_model / "tokenizer.model").is_file():
        raise FileNotFoundError(self.dir_model / "tokenizer.model")
    return _sp(self, *args, **kwargs)
base.TextModel._set_vocab_sentencepiece = _set_vocab_sentencepiece
"""
_CONVERT_RUN = """
sys.argv = [os.path.join(src, "convert_hf_to_gguf.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert(source: Path, hf_dir: Path, out: Path, outtype: str, pre: str, extra: list[str], *, patch: str = "") -> None:
    """Run the converter of ``source`` on ``hf_dir`` into ``out``; ``patch``: Python run in its process first."""
    env = dict(os.environ, REFSIGHT_CONVERTER_DIR=str(source), REFSIGHT_PRE_TOKENIZER=pre)
    script = _CONVERT + patch + "\n" + _CONVERT_RUN
    cmd = [sys.executable, "-c", script, str(hf_dir), "--outfile", str(out), "--outtype", outtype, *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not out.is_file():
        raise ModelLoadError(str(hf_dir), f"convert_hf_to_gguf.py {' '.join(extra)} failed: {proc.stderr[-2000:]}")


def with_chat_template(model: Path, template: str, out: Path) -> Path:
    """A copy of the GGUF ``model`` at ``out`` whose ``tokenizer.chat_template`` is ``template`` (the rest as it
    was), written by gguf-py's ``gguf_new_metadata.py`` from the converter's sdist; returns ``out``."""
    source = converter_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    template_file = out.with_suffix(".jinja")
    template_file.write_text(template, encoding="utf-8")
    script = source / "gguf-py" / "gguf" / "scripts" / "gguf_new_metadata.py"
    env = dict(os.environ, PYTHONPATH=str(source / "gguf-py"))
    proc = subprocess.run([sys.executable, str(script), str(model), str(out), "--chat-template-file", str(template_file),
                           "--force"], env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not out.is_file():
        raise ModelLoadError(str(model), f"gguf_new_metadata.py failed: {proc.stderr[-2000:]}")
    return out


def _looks_like_converter(path: Path) -> bool:
    return (path / "convert_hf_to_gguf.py").is_file() and (path / "gguf-py").is_dir()


def converter_dir() -> Path:
    """The ``vendor/llama.cpp`` directory of the llama-cpp-python sdist (fetched once with pip).

    ``$REFSIGHT_LLAMA_CPP_SRC`` may name an unpacked sdist, its ``vendor/llama.cpp``,
    or the sdist tarball, for machines that cannot reach the package index.
    """
    given = llama_cpp_source()
    if given is not None:
        for candidate in (given, given / "vendor" / "llama.cpp"):
            if _looks_like_converter(candidate):
                return candidate
        if given.is_file():
            return _unpack(given)
        raise ModelLoadError(str(given), "REFSIGHT_LLAMA_CPP_SRC is neither an unpacked llama-cpp-python sdist nor its tarball")
    from filelock import FileLock

    root = model_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    unpacked = root / f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}-src" / "vendor" / "llama.cpp"
    if _looks_like_converter(unpacked):
        return unpacked
    with FileLock(str(root / "llama-cpp-python-src.lock")):
        if _looks_like_converter(unpacked):
            return unpacked
        tarballs = sorted(root.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"))
        if not tarballs:
            # pip is the ordinary client of the package index (and honours its config: mirrors, proxies).
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                 f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(root)],
                capture_output=True, text=True, check=False,
            )
            tarballs = sorted(root.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"))
            if not tarballs:
                raise ModelLoadError(
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                    "cannot fetch the sdist for convert_hf_to_gguf.py (set REFSIGHT_LLAMA_CPP_SRC to an unpacked copy): "
                    + proc.stderr[-1000:],
                )
        return _unpack(tarballs[0], root)


def _unpack(tarball: Path, root: Path | None = None) -> Path:
    """Unpack only what the converter needs (``convert_hf_to_gguf.py``, ``conversion/``, ``gguf-py/``)."""
    root = root or model_cache_dir()
    final = root / f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}-src"
    tmp = Path(tempfile.mkdtemp(prefix=".llama-cpp-src-", dir=root))
    try:
        with tarfile.open(tarball) as tar:
            wanted = [
                m for m in tar.getmembers()
                if "/vendor/llama.cpp/" in m.name
                and m.name.split("/vendor/llama.cpp/", 1)[1].split("/")[0] in {"convert_hf_to_gguf.py", "conversion", "gguf-py"}
            ]
            tar.extractall(tmp, members=wanted, filter="data")
        top = next(tmp.iterdir())
        shutil.rmtree(final, ignore_errors=True)
        os.rename(top, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = final / "vendor" / "llama.cpp"
    if not _looks_like_converter(result):
        raise ModelLoadError(str(tarball), "the sdist has no vendor/llama.cpp/convert_hf_to_gguf.py")
    return result
