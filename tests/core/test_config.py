import pytest

from hybrid_connector.config import ConfigError, load_config, parse_size


def test_sizes():
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("1.5 GiB") == int(1.5 * 2**30)
    assert parse_size(3, 10**9) == 3 * 10**9
    for bad in ("5 parsecs", True, -1, "GB"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_defaults_and_lmcache_keys(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("chunk_size: 512\nmax_local_cpu_size: 2.0\nlocal_disk: file:///tmp/x\n"
                 "max_local_disk_size: 10GB\npools:\n  host:\n    state: 512MiB\n")
    c = load_config(f, environ={})
    assert c.chunk_size == 512 and c.max_local_cpu_size == 2 * 10**9
    assert c.disk_path == "/tmp/x"
    assert c.budget("host").state == 512 * 2**20
    assert c.budget("disk").kv == int(10 * 10**9 * 0.6)
    with pytest.raises(ValueError):
        c.budget("tape")


def test_env_path_and_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("chunk_size: 512\n")
    env = {"HYBRID_CONNECTOR_CONFIG": str(f), "HYBRID_CONNECTOR_CHUNK_SIZE": "1024",
           "HYBRID_CONNECTOR_POOLS__DEVICE__KV": "1GiB", "HYBRID_CONNECTOR_REPLAY": "true"}
    c = load_config(environ=env)
    assert c.chunk_size == 1024 and c.replay is True and c.budget("device").kv == 2**30


@pytest.mark.parametrize("text, needle", [
    ("chunk_sise: 256\n", "chunk_sise"),
    ("chunk_size: big\n", "chunk_size"),
    ("replay: 'yes'\n", "replay"),
    ("pools:\n  host:\n    kv: 12 apples\n", "pools.host.kv"),
    ("chunk_size: 100\nhash_block_size: 16\n", "multiple of hash_block_size"),
    ("local_disk: /tmp/x\n", "max_local_disk_size is 0"),
    ("replay: true\nanchor_density: 0.0\n", "anchor_density"),
    ("max_local_cpu_size: 1GB\npools:\n  host:\n    kv: 2GB\n", "exceeds max_local_cpu_size"),
    ("- a\n- b\n", "mapping"),
])
def test_errors_name_key_and_file(tmp_path, text, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(f, environ={})
    assert needle in str(err.value) and str(f) in str(err.value)


def test_missing_file():
    with pytest.raises(ConfigError, match="cannot read"):
        load_config("/nonexistent/c.yaml", environ={})
