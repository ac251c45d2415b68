"""``pools.<tier>.kv_state``: one budget KV and states share. The default where only a size
key is given (device and host), the contradictions it is refused with, and what the tiers,
the ledger view and the simulator's budget make of it."""

from __future__ import annotations

import pytest

from hybrid_connector.core.config import ConfigError, load_config
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tiers.configured import tier_specs
from hybrid_connector.tiers.size_only import Budget


def test_a_size_key_alone_gives_kv_and_states_one_budget() -> None:
    c = load_config(overrides={"max_local_cpu_size": "10GB", "device_size": "1GB",
                               "local_disk": "/tmp/x", "max_local_disk_size": "10GB"}, environ={})
    host = c.budget("host")
    assert host.pooled and host.kv_state == 9 * 10**9 and host.anchor == 10**9
    assert host.kinds() == {"kv": 9 * 10**9, "state": 9 * 10**9, "anchor": 10**9}
    assert host.total == 10 * 10**9 and c.budget("device").pooled
    disk = c.budget("disk")  # NVMe keeps one pool per kind
    assert not disk.pooled and (disk.kv, disk.state) == (6 * 10**9, 3 * 10**9)
    specs = {s.name: s for s in tier_specs(c)}
    assert specs["host"].kind_pool[ObjectKind.KV] == specs["host"].kind_pool[ObjectKind.STATE]
    assert specs["nvme"].kind_pool[ObjectKind.KV] != specs["nvme"].kind_pool[ObjectKind.STATE]


def test_explicit_kv_state_and_env_override() -> None:
    c = load_config(overrides={"pools": {"host": {"kv_state": "3GB", "anchor": "1GB"}}},
                    environ={})
    assert c.budget("host").kinds()["state"] == 3 * 10**9
    c = load_config(environ={"HYBRID_CONNECTOR_POOLS__HOST__KV_STATE": "2GB"})
    assert c.budget("host").kv_state == 2 * 10**9 and c.budget("host").anchor == 0
    fixed = load_config(overrides={"pools": {"host": {"kv": "2GB", "state": "1GB"}}}, environ={})
    assert not fixed.budget("host").pooled and fixed.budget("host").total == 3 * 10**9


@pytest.mark.parametrize("over, needle", [
    ({"pools": {"host": {"kv_state": "2GB", "kv": "1GB"}}}, "kv_state (one budget KV and "
     "states share) and kv are both set"),
    ({"pools": {"host": {"kv_state": "2GB", "kv": "1GB", "state": "1GB"}}}, "kv and state"),
    ({"pools": {"host": {"kv_state": "2GB", "state": 0}}}, "and state are both set"),
    ({"pools": {"host": {"kv_state": "5GB", "anchor": "1GB"}}}, "exceeds max_local_cpu_size"),
    ({"remote_url": "redis://127.0.0.1:6379", "pools": {"remote": {"kv_state": "1GB"}}},
     "pools.remote.kv_state"),
    ({"local_cpu": False, "pools": {"host": {"kv_state": "1GB"}}}, "local_cpu is false"),
])
def test_contradictions_are_refused(over: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match="pools") as err:
        load_config(overrides=over, environ={})
    assert needle in str(err.value)


def test_the_simulator_budget_pools_kv_and_states() -> None:
    c = load_config(overrides={"pools": {"host": {"kv_state": "3GB", "anchor": "1GB"}}},
                    environ={})
    b = Budget.from_config(c)
    assert b.kinds[ObjectKind.KV] == b.kinds[ObjectKind.STATE] == "main"
    assert b.pools == {"main": 3 * 10**9, "anchor": 10**9}
    fixed = Budget.from_config(load_config(
        overrides={"pools": {"host": {"kv": "2GB", "state": "1GB"}}}, environ={}))
    assert fixed.pools == {"kv": 2 * 10**9, "state": 10**9, "anchor": 0}


def test_the_alpha_tuners_twins_share_the_budget_when_the_live_cache_does() -> None:
    from hybrid_connector.runtime.tuner_caches import snapshot_budget

    snap = {ObjectKind.KV: 300, ObjectKind.STATE: 100, ObjectKind.ANCHOR: 0}
    assert snapshot_budget(snap).pools == {"kv": 300, "state": 100, "anchor": 300}
    twin = snapshot_budget(snap, joint=True)
    assert twin.pools == {"main": 400, "anchor": 300}
    assert twin.kinds[ObjectKind.KV] == twin.kinds[ObjectKind.STATE] == "main"
    shared = load_config(overrides={"max_local_cpu_size": "1GB"}, environ={})
    assert Budget.joint(shared)
    assert not Budget.joint(load_config(
        overrides={"pools": {"host": {"kv": "1GB", "state": "1GB"}}}, environ={}))
