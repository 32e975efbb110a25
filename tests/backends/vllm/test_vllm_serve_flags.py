"""``refsight vllm-serve MODEL --store DIR`` wires refsight's encoder-cache connector (no vLLM needed here).

The command line is parsed by refsight's own parser; the flag and the environment are what
``start_server`` hands the vLLM process (a real start is ``test_vllm_encoder_cache.py``).
"""

from __future__ import annotations

import json

import pytest


def _args(*argv: str):
    from refsight.cli import _resolve_store_options, build_parser

    args = build_parser().parse_args(["vllm-serve", "tiny-qwen2-vl-vllm", *argv])
    _resolve_store_options(args)
    return args


def test_the_connector_follows_store_and_its_quota(tmp_path):
    from refsight.cli.vllm import _encoder_cache

    store = tmp_path / "store"
    assert _encoder_cache(_args()) == (None, 0)  # no --store: no connector
    assert _encoder_cache(_args("--store", str(store))) == (str(store), 0)
    assert _encoder_cache(_args("--store", str(store), "--no-encoder-cache")) == (None, 0)
    assert _encoder_cache(_args("--store", str(store), "--image-limit", "0")) == (None, 0)  # no vision encoder
    assert _encoder_cache(_args("--store", str(store), "--max-package-bytes", "2MiB")) == (str(store), 2 << 20)
    store.mkdir()
    (store / "refsight.toml").write_text('[store]\nmax_package_bytes = "1MiB"\n')
    assert _encoder_cache(_args("--store", str(store))) == (str(store), 1 << 20)


def test_the_flag_and_environment_name_the_connector_folder_alone(tmp_path, monkeypatch):
    from refsight.vllm_connector import CONNECTOR_CLASS, CONNECTOR_MODULE, CONNECTOR_PATH
    from refsight.backends.vllm.serve import _server_env, encoder_cache_flag

    flag, config = encoder_cache_flag(tmp_path / "store", max_bytes=123)
    assert flag == "--ec-transfer-config"
    assert json.loads(config) == {
        "ec_connector": CONNECTOR_CLASS, "ec_connector_module_path": CONNECTOR_MODULE, "ec_role": "ec_both",
        "ec_connector_extra_config": {"store": str((tmp_path / "store").resolve()), "max_bytes": 123},
    }
    assert (CONNECTOR_PATH / f"{CONNECTOR_MODULE}.py").is_file() and (CONNECTOR_PATH / "refsight_ec_store.py").is_file()
    monkeypatch.setenv("PYTHONPATH", "/somewhere/refsight/src")
    assert _server_env(True)["PYTHONPATH"] == str(CONNECTOR_PATH)
    assert "PYTHONPATH" not in _server_env(False)


@pytest.mark.parametrize("bad", ["lots", "-1"])
def test_a_bad_quota_is_refused_naming_the_flag(tmp_path, bad):
    from refsight.cli.vllm import _encoder_cache
    from refsight.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="max-package-bytes"):
        _encoder_cache(_args("--store", str(tmp_path), "--max-package-bytes", bad))
