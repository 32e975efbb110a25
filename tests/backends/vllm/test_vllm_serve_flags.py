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
    from refsight.backends.vllm.serve import encoder_cache_flag
    from refsight.cli.arguments import UsageError
    from refsight.cli.vllm import _encoder_cache

    store = tmp_path / "store"
    assert _encoder_cache(_args()) == (None, 0, None)  # no --store: no connector
    assert _encoder_cache(_args("--store", str(store))) == (str(store), 0, None)
    assert _encoder_cache(_args("--store", str(store), "--no-encoder-cache")) == (None, 0, None)
    assert _encoder_cache(_args("--store", str(store), "--image-limit", "0")) == (None, 0, None)  # no vision encoder
    assert _encoder_cache(_args("--store", str(store), "--max-package-bytes", "2MiB")) == (str(store), 2 << 20, None)
    store.mkdir()
    (store / "refsight.toml").write_text('[store]\nmax_package_bytes = "1MiB"\n')
    assert _encoder_cache(_args("--store", str(store))) == (str(store), 1 << 20, None)
    # A bucket store: the files in --local-dir, shared through the bucket; its settings are --config's.
    local = tmp_path / "local"
    assert _encoder_cache(_args("--store", "s3://fleet/x", "--local-dir", str(local), "--config",
                                str(store / "refsight.toml"))) == (str(local), 1 << 20, "s3://fleet/x")
    with pytest.raises(UsageError, match="--local-dir"):
        _encoder_cache(_args("--store", "s3://fleet/x"))
    flag = json.loads(encoder_cache_flag(local, bucket="s3://fleet/x")[1])
    assert flag["ec_connector_extra_config"]["bucket"] == "s3://fleet/x"


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


def test_tiny_models_run_inside_the_engine_process_and_real_ones_keep_their_worker(tmp_path, monkeypatch):
    from refsight.backends.vllm.serve import _server_env, runs_in_engine_process, server_command

    assert runs_in_engine_process("tiny-qwen2-vl-vllm", True)
    assert not runs_in_engine_process("shape-qwen2-vl-2b-vllm", True)  # real shapes: vLLM's bound OpenMP worker
    assert not runs_in_engine_process(str(tmp_path), False)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    # vLLM's CPU platform keeps "uni" only with multiprocessing off: the flag and the variable go together.
    assert _server_env(False, True)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in _server_env(False)
    one = server_command(tmp_path / "python", tmp_path, 8000, tiny=False, image_limit=8, one_process=True)
    assert one[one.index("--distributed-executor-backend") + 1] == "uni"
    assert "--distributed-executor-backend" not in server_command(tmp_path / "python", tmp_path, 8000, tiny=False, image_limit=8)


@pytest.mark.parametrize("bad", ["lots", "-1"])
def test_a_bad_quota_is_refused_naming_the_flag(tmp_path, bad):
    from refsight.cli.vllm import _encoder_cache
    from refsight.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="max-package-bytes"):
        _encoder_cache(_args("--store", str(tmp_path), "--max-package-bytes", bad))
