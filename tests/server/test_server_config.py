"""The server's config sections, the example configs, and the CLI's flag overrides."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from hybrid_connector import assemble
from hybrid_connector.cli import build_parser
from hybrid_connector.core.config import ConfigError, load_config
from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.server.cli import overrides

ROOT = Path(__file__).resolve().parents[2]


def test_example_configs_load(tmp_path: Path) -> None:
    engine = load_config(ROOT / "configs/engine-server-mode.yaml", environ={})
    assert engine.cache_server is not None and engine.cache_server.url == "hc://127.0.0.1:65432"
    server = yaml.safe_load((ROOT / "configs/server.yaml").read_text())
    server["local_disk"] = str(tmp_path)
    cfg = load_config(overrides=server, environ={})
    assert cfg.server.port == 65432 and cfg.server.max_object_bytes == 256 << 20


@pytest.mark.parametrize("bad", [{"url": "lm://127.0.0.1:1"}, {"url": "hc://"},
                                 {"url": "hc://h:99999"}, {"url": "hc://h:1", "timeout_s": 0}])
def test_bad_cache_server_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="cache_server"):
        load_config(overrides={"cache_server": bad}, environ={})


def test_tier_keys_are_refused_in_server_mode() -> None:
    with pytest.raises(ConfigError, match="tiers live in the server"):
        load_config(overrides={"cache_server": {"url": "hc://127.0.0.1:1"},
                               "local_disk": "/tmp/x", "max_local_disk_size": 1}, environ={})
    cfg = load_config(overrides={"cache_server": {"url": "hc://127.0.0.1:1"}}, environ={})
    with pytest.raises(ValueError, match="tiers and policies are the server's"):
        assemble.engine_cache(cfg, get_preset("qwen3.5-0.8b"), backend=assemble.store(
            load_config(overrides={"max_local_cpu_size": 0.001}, environ={})))


def test_unreachable_server_fails_loudly_at_construction() -> None:
    from tier_servers import free_port

    from hybrid_connector.remote.client.connection import ServerUnavailable

    cfg = load_config(overrides={"cache_server": {"url": f"hc://127.0.0.1:{free_port()}",
                                                  "timeout_s": 2.0}}, environ={})
    with pytest.raises(ServerUnavailable, match="cannot connect"):
        assemble.engine_cache(cfg, get_preset("qwen3.5-0.8b"))


def test_flags_override_the_yaml() -> None:
    args = build_parser().parse_args(["server", "--config", "x.yaml", "--port", "0",
                                      "--token", "s3cret-token", "--disk", "/d",
                                      "--disk-size", "2GB", "--host-size", "1GB"])
    assert isinstance(args, argparse.Namespace)
    assert overrides(args) == {"server": {"port": 0, "token": "s3cret-token"},
                               "local_disk": "/d", "max_local_disk_size": "2GB",
                               "max_local_cpu_size": "1GB"}
