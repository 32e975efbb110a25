"""The config file (refsight.toml). What the CLI passes on (its flags, the file read once): tests/test_cli.py."""

from __future__ import annotations

import pytest

from refsight.backends.options import BackendOptions
from refsight.errors import InvalidInputError
from refsight.settings import CONFIG_NAME, load_settings

CONFIG = """
[backend]
device = "cpu"
dtype = "bfloat16"
batch_size = 8

[backend.processor_kwargs]
do_normalize = true

[models."tiny-qwen2-vl"]
max_pixels = 12544
dtype = "float32"

[models."tiny-qwen2-vl".processor_kwargs]
resample = 2
"""


def test_store_file_gives_backend_and_model_options(tmp_path):
    (tmp_path / CONFIG_NAME).write_text(CONFIG)
    settings = load_settings(tmp_path)
    assert settings.path == tmp_path / CONFIG_NAME
    assert settings.backend_options("tiny-smolvlm") == BackendOptions(
        device="cpu", dtype="bfloat16", batch_size=8, processor_kwargs={"do_normalize": True}
    )
    assert settings.backend_options("tiny-qwen2-vl") == BackendOptions(
        device="cpu", dtype="float32", batch_size=8, max_pixels=12544, processor_kwargs={"do_normalize": True, "resample": 2}
    )


def test_no_file_is_no_options(tmp_path):
    assert load_settings(tmp_path).backend_options("any") == BackendOptions()
    assert load_settings(None).path is None


def test_explicit_file_wins_and_must_exist(tmp_path):
    (tmp_path / CONFIG_NAME).write_text(CONFIG)
    other = tmp_path / "other.toml"
    other.write_text('[backend]\nattn = "eager"\n')
    assert load_settings(tmp_path, other).backend_options("tiny-qwen2-vl") == BackendOptions(attn="eager")
    with pytest.raises(InvalidInputError, match="missing.toml: no such config file"):
        load_settings(tmp_path, tmp_path / "missing.toml")


def test_a_config_that_is_no_regular_file_says_what_it_is(tmp_path):
    import os

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), ("/dev/zero", "a character device"), (tmp_path, "a directory")):
        with pytest.raises(InvalidInputError) as e:
            load_settings(None, path)  # never blocks on the FIFO, never reads /dev/zero for ever
        assert e.value.input == str(path) and kind in e.value.reason and "no such" not in e.value.reason


def test_a_deeply_nested_config_is_refused_naming_the_file(tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text("[backend]\ndevice = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(InvalidInputError) as e:
        load_settings(None, deep)
    assert e.value.input == str(deep) and "nested more than 64 levels" in e.value.reason
    (tmp_path / CONFIG_NAME).write_text('[backend]\nprocessor_kwargs = {a = [[1, 2], [3]]}\n')
    assert load_settings(tmp_path).backend.processor_kwargs == {"a": [[1, 2], [3]]}  # modest nesting still reads


@pytest.mark.parametrize(
    "text, match",
    [
        ('[backend]\ndevise = "cpu"\n', r"refsight.toml \[backend\]: devise: unknown option"),
        ('[backend]\ndtype = "float64"\n', r"refsight.toml \[backend\] dtype 'float64'"),
        ('[models."m"]\nmax_pixels = -3\n', r'refsight.toml \[models."m"\] max_pixels'),
        ('[models."m"]\nbatch_size = "four"\n', r'refsight.toml \[models."m"\] batch_size'),
        ("[backends]\n", r"refsight.toml: backends: unknown table"),
        ("models = 3\n", r"refsight.toml models: must hold tables"),
        ("[backend\n", r"refsight.toml: not valid TOML"),
    ],
)
def test_bad_keys_and_values_name_file_and_key(tmp_path, text, match):
    (tmp_path / CONFIG_NAME).write_text(text)
    with pytest.raises(InvalidInputError, match=match):
        load_settings(tmp_path)


def test_a_store_remembers_the_options_it_was_filled_with_and_keeps_a_table_already_there(tmp_path):
    from refsight.settings import remember_model_options

    # No file yet: one is made, and every command opening the store reads the model's table from it.
    options = BackendOptions(max_pixels=262144, processor_kwargs={"do_image_splitting": False})
    assert remember_model_options(tmp_path, "shape-smolvlm-256m", options) == options
    assert load_settings(tmp_path).backend_options("shape-smolvlm-256m") == options
    # A file of the user's: the new table is added after it, what was there is kept.
    other = tmp_path / "other"
    other.mkdir()
    (other / CONFIG_NAME).write_text(CONFIG)
    assert remember_model_options(other, "tiny-smolvlm", BackendOptions(max_pixels=1024)).max_pixels == 1024
    assert load_settings(other).backend_options("tiny-qwen2-vl").max_pixels == 12544
    # A table already there for that model is whoever wrote it's choice: nothing written, its options answered.
    before = (other / CONFIG_NAME).read_text()
    assert remember_model_options(other, "tiny-qwen2-vl", BackendOptions(max_pixels=1)).max_pixels == 12544
    assert (other / CONFIG_NAME).read_text() == before
