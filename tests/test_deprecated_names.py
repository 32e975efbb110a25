"""The retired words of the glossary (docs/architecture.md) stay accepted where callers may still write them.

Each old spelling does what the new one does and warns with ``DeprecationWarning`` naming the new one;
both spellings at once is refused, naming the old one.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from runtimes import require_module

from refsight import Engine, InvalidInputError, open_store
from refsight.cli import build_parser
from refsight.environment import default_redis_url
from refsight.settings import load_settings

URL = "redis://127.0.0.1:6379/0"


def test_store_cache_key_is_read_as_redis(tmp_path):
    (tmp_path / "refsight.toml").write_text(f'[store]\ncache = "{URL}"\n')
    with pytest.deprecated_call(match="use redis"):
        settings = load_settings(tmp_path)
    assert settings.store.redis == URL
    assert settings.store_options()["redis"] == URL


def test_store_cache_and_redis_keys_together_are_refused(tmp_path):
    (tmp_path / "refsight.toml").write_text(f'[store]\ncache = "{URL}"\nredis = "{URL}"\n')
    with pytest.raises(InvalidInputError, match="deprecated name of redis"):
        load_settings(tmp_path)


@pytest.mark.parametrize("opener", [open_store, Engine], ids=["open_store", "Engine"])
def test_cache_keyword_with_redis_is_refused_before_any_work(tmp_path, opener):
    with pytest.raises(InvalidInputError) as info:
        opener(tmp_path / "store", cache=URL, redis=URL)
    assert info.value.input == "cache"
    assert not (tmp_path / "store").exists()


def test_cache_keyword_still_opens_the_redis_tier(tmp_path, redis_server):
    require_module("redis", "pip install 'refsight[redis]'")
    with pytest.deprecated_call(match="use redis"):
        store = open_store(tmp_path / "s", memory_bytes=0, cache=redis_server.url)
    with store:
        assert [t.name for t in store.packages.tiers] == ["memory", "redis", "disk"]


def test_refsight_cache_environment_variable_is_read_as_refsight_redis(monkeypatch):
    monkeypatch.delenv("REFSIGHT_REDIS", raising=False)
    monkeypatch.setenv("REFSIGHT_CACHE", URL)
    with pytest.deprecated_call(match=r"\$REFSIGHT_REDIS"):
        assert default_redis_url() == URL
    monkeypatch.setenv("REFSIGHT_REDIS", "redis://elsewhere:6379/1")
    assert default_redis_url() == "redis://elsewhere:6379/1"


def test_server_config_old_names():
    from refsight.server.config import ServerConfig

    with pytest.deprecated_call(match="use share_packages"):
        config = ServerConfig(share_encodes=True)
    assert config.share_packages is True
    with pytest.deprecated_call(match="use redis"):
        assert ServerConfig(cache=URL).redis == URL
    assert ServerConfig().share_packages is False and ServerConfig().redis is None


def test_server_deps_tenant_is_namespace():
    from refsight.server import deps

    with pytest.deprecated_call(match="use Namespace"):
        assert deps.Tenant is deps.Namespace


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["serve", "--share-encodes"], "share_packages", True),
        (["stats", "--cache", URL], "redis", URL),
        (["generate", "--ref", "a", "--prompt", "p", "--no-kv-cache"], "prefix_states", False),
        (["compare", "new.jpg", "--criteria", "c", "--no-kv-cache"], "prefix_states", False),
    ],
    ids=["share-encodes", "cache", "generate-no-kv-cache", "compare-no-kv-cache"],
)
def test_cli_old_flags_do_what_the_new_ones_do(argv, dest, value):
    with pytest.deprecated_call(match="is deprecated; use --"):
        args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value


def test_cli_shows_the_old_flag_warning_on_stderr(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "refsight.cli", "list", "--store", str(tmp_path / "s"), "--cache", URL, "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert "--cache is deprecated; use --redis" in result.stderr


@pytest.mark.parametrize("name", ["check_text", "printable_text", "escape_controls", "read_regular_file", "load_json"])
def test_front_end_tools_moved_out_of_the_public_api_are_still_served(name):
    import refsight
    from refsight import inputs  # noqa: F401  (the package whose modules hold them now)

    assert name not in refsight.__all__
    with pytest.deprecated_call(match=f"use refsight.inputs.[a-z]+.{name}"):
        moved = getattr(refsight, name)
    homes = [sys.modules[m] for m in sys.modules if m.startswith("refsight.inputs.")]
    assert any(getattr(home, name, None) is moved for home in homes)


def test_the_retired_config_module_still_serves_its_names_with_a_warning():
    import refsight.config
    import refsight.environment

    with pytest.warns(DeprecationWarning, match="refsight.environment.default_model"):
        assert refsight.config.default_model is refsight.environment.default_model
    with pytest.raises(AttributeError):
        refsight.config.never_existed  # noqa: B018


def test_the_retired_models_package_still_serves_the_embedders_with_a_warning(monkeypatch):
    import refsight.embedders
    import refsight.embedders.base
    import refsight.embedders.registry
    import refsight.models

    with pytest.warns(DeprecationWarning, match="use refsight.embedders.get_embedder"):
        assert refsight.models.get_embedder is refsight.embedders.get_embedder
    with pytest.raises(AttributeError, match="refsight.models"):
        refsight.models.never_existed  # noqa: B018
    # a module by its old path is the new module itself (one registry), embedders.py by its new name
    for old, new in [("refsight.models.registry", refsight.embedders.registry),
                     ("refsight.models.embedders", refsight.embedders.base)]:
        monkeypatch.delitem(sys.modules, old, raising=False)
        with pytest.warns(DeprecationWarning, match=f"use {new.__name__}"):
            assert importlib.import_module(old) is new
        assert new.__spec__.name == new.__name__
    monkeypatch.delitem(sys.modules, "refsight.models.embedders")
    with pytest.warns(DeprecationWarning, match="use refsight.embedders.base"):
        from refsight.models.embedders import Embedder
    assert Embedder is refsight.embedders.base.Embedder
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("refsight.models.never_existed")
