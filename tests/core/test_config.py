import pytest

from hybrid_connector.core.config import ConfigError, load_config, parse_size


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


# ---------------------------------------------------------------- issue 9, item 20
def _load_text(tmp_path, text):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    return f, (lambda: load_config(f, environ={}))


def _raises_naming(tmp_path, text, *needles):
    f, load = _load_text(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load()
    for needle in (str(f), *needles):
        assert needle in str(err.value), (needle, str(err.value))
    return str(err.value)


@pytest.mark.parametrize("text, key", [
    ("max_local_cpu_size: .inf\n", "max_local_cpu_size"),
    ("max_local_cpu_size: .nan\n", "max_local_cpu_size"),
    ("max_local_cpu_size: -.inf\n", "max_local_cpu_size"),
    ("max_local_cpu_size: 5000000000\n", "max_local_cpu_size"),  # bytes written as GB: 5 EB
    ("device_size: 1.0e+30\n", "device_size"),
    ("pools:\n  device:\n    state: .inf\n", "pools.device.state"),
    ("pools:\n  host:\n    kv: -1\n", "pools.host.kv"),
])
def test_non_finite_negative_and_absurd_sizes_are_config_errors(tmp_path, text, key):
    _raises_naming(tmp_path, text, f"'{key}'")


def test_parse_size_rejects_non_finite_and_absurd():
    for bad in (float("inf"), float("nan"), 2.0**70, "9999999 TiB"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert parse_size("1TiB") == 2**40


def test_local_cpu_false_with_host_pools_is_contradictory(tmp_path):
    _raises_naming(tmp_path, "local_cpu: false\npools:\n  host:\n    kv: 64MiB\n",
                   "local_cpu", "pools.host")
    _, load = _load_text(tmp_path, "local_cpu: false\n")
    assert load().budget("host").total == 0


@pytest.mark.parametrize("text, key", [
    ("alpha: .nan\n", "alpha"),
    ("alpha: .inf\n", "alpha"),
    ("alpha: -1.0\n", "alpha"),
    ("alpha_grid: [-5.0]\n", "alpha_grid"),
    ("alpha_grid: [0.0, .nan]\n", "alpha_grid"),
    ("alpha_grid: [0.0, .inf]\n", "alpha_grid"),
    ("alpha_grid: []\n", "alpha_grid"),
])
def test_alpha_and_grid_must_be_finite_and_non_negative(tmp_path, text, key):
    _raises_naming(tmp_path, text, f"'{key}")


@pytest.mark.parametrize("text, key", [
    ("use_layerwise: true\n", "use_layerwise"),
])
def test_unhonoured_lmcache_keys_accept_only_their_defaults(tmp_path, text, key):
    msg = _raises_naming(tmp_path, text, f"'{key}'")
    assert "not honoured" in msg
    # An LMCache YAML that spells out the defaults still loads.
    _, load = _load_text(tmp_path, "save_decode_cache: false\nuse_layerwise: false\n"
                                   "lookup_timeout_ms: 3000\n")
    load()


def test_lookup_timeout_is_the_discovery_deadline(tmp_path):
    _, load = _load_text(tmp_path, "lookup_timeout_ms: 250\n")
    assert load().lookup_timeout_ms == 250              # honoured: see discovery.py
    _raises_naming(tmp_path, "lookup_timeout_ms: 0\n", "'lookup_timeout_ms'")


def test_tier_keys_are_typed_and_validated(tmp_path):
    _, load = _load_text(tmp_path, "local_disk: /tmp/x\nmax_local_disk_size: 1\n"
                                   "disk_zstd: [state, anchor]\ndisk_fsync: false\n"
                                   "disk_verify_reads: false\n")
    c = load()
    assert c.disk_zstd == {"state": 3, "anchor": 3}
    assert c.disk_fsync is False and c.disk_verify_reads is False
    _, load = _load_text(tmp_path, "local_disk: /tmp/x\nmax_local_disk_size: 1\n"
                                   "disk_zstd: {kv: 7}\n")
    assert load().disk_zstd == {"kv": 7}
    d = load_config(None, environ={})
    assert d.disk_zstd == {} and d.disk_fsync and d.disk_verify_reads and d.remote_timeout_s == 1.0
    disk = "local_disk: /tmp/x\nmax_local_disk_size: 1\n"
    for text, key in [(disk + "disk_zstd: [bogus]\n", "disk_zstd"),
                      (disk + "disk_zstd: {kv: 99}\n", "disk_zstd"),
                      (disk + "disk_zstd: true\n", "disk_zstd"),
                      (disk + "disk_fsync: 'no'\n", "disk_fsync"),
                      (disk + "disk_verify_reads: 1\n", "disk_verify_reads"),
                      ("remote_timeout_s: 0\n", "remote_timeout_s"),
                      ("remote_timeout_s: -1.0\n", "remote_timeout_s"),
                      ("remote_timeout_s: .inf\n", "remote_timeout_s")]:
        _raises_naming(tmp_path, text, f"'{key}")


@pytest.mark.parametrize("text, needles", [
    ("disk_zstd: [kv]\n", ("disk_zstd", "local_disk")),
    ("disk_fsync: false\n", ("disk_fsync", "local_disk")),
    ("remote_timeout_s: 2.0\n", ("remote_timeout_s", "remote_url")),
    ("remote_serde: zstd\n", ("remote_serde", "remote_url")),
    ("pools:\n  disk:\n    kv: 1GiB\n", ("pools.disk", "local_disk")),
    ("pools:\n  remote:\n    kv: 1GiB\n", ("pools.remote", "remote_url")),
    ("remote_url: lm://127.0.0.1:9\n", ("remote_url", "pools.remote")),
    ("local_disk: /tmp/x\npools:\n  disk:\n    kv: 0\n", ("local_disk", "pools.disk")),
    ("device_size: 1MiB\npools:\n  device:\n    kv: 2MiB\n", ("pools.device", "device_size")),
])
def test_keys_of_an_absent_tier_are_rejected_not_ignored(tmp_path, text, needles):
    _raises_naming(tmp_path, text, *needles)


def test_legacy_extra_config_tier_keys_move_to_the_typed_keys(tmp_path, caplog):
    _, load = _load_text(tmp_path, "local_disk: /tmp/x\nmax_local_disk_size: 1\n"
                                   "extra_config: {disk_zstd: [state], config_file: a.yaml}\n")
    c = load()
    assert c.disk_zstd == {"state": 3} and c.extra_config == {"config_file": "a.yaml"}
    assert "extra_config.disk_zstd" in caplog.text
    _raises_naming(tmp_path, "local_disk: /tmp/x\nmax_local_disk_size: 1\n"
                             "extra_config: {disk_zstd: [bogus]}\n", "disk_zstd")
    _raises_naming(tmp_path, "remote_timeout_s: 2.0\nextra_config: {remote_timeout_s: 3.0}\n",
                   "extra_config.remote_timeout_s", "remote_timeout_s")


def test_tiers_are_built_from_the_typed_keys(tmp_path):
    from hybrid_connector.core.keys import ObjectKind
    from hybrid_connector.tiers.manager import TieredStore

    cfg = load_config(overrides={
        "local_disk": str(tmp_path / "d"), "max_local_disk_size": 0.001,
        "disk_zstd": {"state": 5}, "disk_fsync": False, "disk_verify_reads": False,
        "remote_url": "lm://127.0.0.1:9", "pools": {"remote": {"kv": "1MiB"}},
        "remote_timeout_s": 0.25,
    }, environ={})
    m = TieredStore.from_config(cfg)
    try:
        nvme, remote = (t for t in m.tiers if t.name in ("nvme", "remote"))
        assert nvme.zstd == {ObjectKind.STATE: 5}
        assert nvme.fsync is False and nvme.verify_reads is False
        assert remote.client.timeout == 0.25
    finally:
        m.close()
