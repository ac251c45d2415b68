"""HybridConnector against the real vLLM 0.33.0 (CPU, ``VLLM_TARGET_DEVICE=cpu``): loaded
through vLLM's factory for both roles, fail-closed start-up, and vLLM's own Scheduler
serving shared-prefix requests through the connector with every KV and state byte the
"model" reads checked (``vllm_harness``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402
import vllm_procs as vp  # noqa: E402
import vllm_support as s  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorRole,
    SupportsHMA,
)

from hybrid_connector.integrations.vllm import HybridConnector, HybridStartupError  # noqa: E402

YAML = s.BASE_YAML


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("vllm")
    y = root / "hybrid.yaml"
    y.write_text(YAML)
    model = s.tiny_nemotron_h(root)
    vc = s.vllm_config(model, y)
    return {"root": root, "yaml": y, "model": model, "vc": vc,
            "cfg": s.kv_cache_config(vc, num_blocks=7)}


def _worker(env: dict[str, Any], vc: Any | None = None) -> Any:
    return KVConnectorFactory.create_connector(vc or env["vc"], KVConnectorRole.WORKER, env["cfg"])


def test_the_factory_loads_both_roles_from_the_json_config(env: dict[str, Any]) -> None:
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        c = KVConnectorFactory.create_connector(env["vc"], role, env["cfg"])
        assert isinstance(c, HybridConnector) and isinstance(c, KVConnectorBase_V1)
        assert isinstance(c, SupportsHMA)
        assert c.groups.block_size == s.BLOCK and len(c.groups.recurrent_groups) == 2
        c.shutdown()


def _with(env: dict[str, Any], yaml: str | None = None, policy: str = "recompute") -> Any:
    vc = copy.deepcopy(env["vc"])
    vc.kv_transfer_config.kv_load_failure_policy = policy
    if yaml is not None:
        p = Path(env["root"]) / f"bad{abs(hash(yaml))}.yaml"
        p.write_text(yaml)
        vc.kv_transfer_config.kv_connector_extra_config = {"config_file": str(p)}
    return vc


@pytest.mark.parametrize("case, match", [
    ("policy", "kv_load_failure_policy"),
    ("chunk", "not a multiple of vLLM's block size"),
    ("model", "is not the served model"),
    ("mamba_mode", "mamba_cache_mode"),
    ("hma_off", "hybrid KV cache manager is disabled"),
    ("vocab", "namespaces"),
    ("pipeline", "pipeline_parallel_size=2"),
])
def test_start_up_fails_closed(env: dict[str, Any], case: str, match: str) -> None:
    vc = _with(env, policy="fail") if case == "policy" else _with(env)
    if case == "chunk":
        vc = _with(env, YAML.replace("chunk_size: 64", "chunk_size: 48").replace(": 32", ": 16"))
    elif case == "model":
        vc = _with(env, YAML + "model: qwen3.5-4b\n")
    elif case == "mamba_mode":
        vc.cache_config.mamba_cache_mode = "none"
    elif case == "hma_off":
        vc.scheduler_config.disable_hybrid_kv_cache_manager = True
    elif case == "pipeline":  # a stage's worker holds some layers only
        vc.parallel_config.pipeline_parallel_size = 2
    elif case == "vocab":  # ids past 2**24 cannot be lifted into a namespace
        vc.model_config.model_arch_config.vocab_size = (1 << 24) + 1
    with pytest.raises(HybridStartupError, match=match):
        HybridConnector(vc, KVConnectorRole.SCHEDULER, env["cfg"])


def _requests(seed: int, n: int = 8) -> list[Any]:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 128, 300).tolist()
    return [h.make_request(f"r{i}", base[: 120 + (i * 37) % 160] + rng.integers(0, 128, 20).tolist(), 6)
            for i in range(n)]


def _serve(env: dict[str, Any], connector: bool, evict_every: int = 2,
           lose: bool = False, divergent: bool = False) -> tuple[dict[str, list[int]], h.Runner, Any]:
    vc = env["vc"] if connector else copy.deepcopy(env["vc"])
    if not connector:
        vc.kv_transfer_config = None
    elif divergent:
        y = Path(env["root"]) / "divergent.yaml"
        y.write_text(YAML + "extra_config: {divergent_hits: true}\n")
        vc = _with(env)
        vc.kv_transfer_config.kv_connector_extra_config = {"config_file": str(y)}
    sched = h.make_scheduler(vc, env["cfg"])
    worker = _worker(env, vc) if connector else None
    runner = h.Runner(env["cfg"], worker)
    if lose:  # every object vanishes from the worker's tiers right after it is stored
        vp.lose_everything(worker)
    outs = h.run(sched, runner, _requests(3), evict_every=evict_every)
    return outs, runner, sched


@pytest.mark.parametrize("divergent", [False, True])
def test_hits_through_vllms_scheduler_are_exact_and_save_compute(env: dict[str, Any],
                                                                 divergent: bool) -> None:
    base_out, base_run, _ = _serve(env, connector=False)
    outs, run, sched = _serve(env, connector=True, divergent=divergent)
    assert sched.connector.supports_divergent_local_hybrid_hits == divergent
    assert base_run.bad == [] and run.bad == [], run.bad[:3]
    assert outs == base_out                                   # same tokens generated
    st = sched.connector.sched.stats
    assert st.hits >= 3 and st.failed_loads == 0 and st.hit_tokens > 0
    assert run.computed_tokens < base_run.computed_tokens     # the hits were not recomputed
    # at least what was loaded; more where a loaded state also let vLLM use a local
    # attention hit deeper than its own Mamba hit (supports_divergent_local_hybrid_hits)
    assert base_run.computed_tokens - run.computed_tokens >= st.loaded_tokens
    sched.connector.sched.index.check_integrity()


def test_a_load_that_fails_on_the_worker_is_recomputed(env: dict[str, Any],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Junctions off: a junction our index offers makes vLLM's own device cache keep the
    # branch state, which saves compute even when every load fails (1,364 tokens computed
    # against 1,524 without a connector), and this test compares compute with no connector.
    import hybrid_connector.integrations.vllm.scheduler as vs
    monkeypatch.setattr(vs, "offer_junction", lambda *a, **k: 0)
    base_out, base_run, _ = _serve(env, connector=False)
    outs, run, sched = _serve(env, connector=True, lose=True)
    st = sched.connector.sched.stats
    assert run.bad == [] and outs == base_out
    assert st.failed_loads >= 1 and st.hits == 0
    assert run.computed_tokens >= base_run.computed_tokens   # every failed hit recomputed


TIER_YAML = {
    "host": "pools:\n  host: {{kv: 4MB, state: 2MB}}\n",
    "disk": s.DISK_YAML,
    "redis": "local_cpu: false\nremote_url: {url}\npools:\n  remote: {{kv: 8MB, state: 8MB}}\n",
    "lm": "local_cpu: false\nremote_url: {url}\npools:\n  remote: {{kv: 8MB, state: 8MB}}\n",
}
TIER_NAME = {"host": "host", "disk": "nvme", "redis": "remote", "lm": "remote"}


@pytest.mark.parametrize("tier", list(TIER_YAML))
def test_blocks_saved_and_loaded_into_other_blocks_are_bit_identical_through_every_tier(
        env: dict[str, Any], tier: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Every tier alone: each request's KV blocks and state pages, saved from the blocks vLLM
    gave it, come back into the blocks vLLM gives a later request, byte for byte (the
    runner checks every byte it reads)."""
    url = ""
    if tier in ("redis", "lm"):
        url = request.getfixturevalue("redis_server" if tier == "redis" else "lmcache_server")
    y = tmp_path / f"{tier}.yaml"
    y.write_text(YAML.split("pools:")[0] + TIER_YAML[tier].format(dir=tmp_path / "nvme", url=url))
    vc = copy.deepcopy(env["vc"])
    vc.kv_transfer_config.kv_connector_extra_config = {"config_file": str(y)}
    sched = h.make_scheduler(vc, env["cfg"])
    worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, env["cfg"])
    runner = h.Runner(env["cfg"], worker)
    try:
        h.run(sched, runner, _requests(3), evict_every=1)
    finally:
        worker.shutdown()
    st = sched.connector.sched.stats
    assert runner.bad == [], runner.bad[:3]
    assert st.hits >= 3 and st.failed_loads == 0
    assert set(st.hit_sources) == {TIER_NAME[tier]}


@pytest.mark.parametrize("decode, retention", [(False, None), (True, 0), (True, None), (True, 64)])
def test_save_decode_cache_lets_the_next_turn_hit_past_the_last_prompt(
        env: dict[str, Any], tmp_path: Path, decode: bool, retention: int | None) -> None:
    """Generated tokens' KV and states are saved with ``save_decode_cache``, at the
    boundaries vLLM offers (none during decode with its default retention interval 0) and
    at the first turn's exact end (``test_vllm_tail``), where the next turn then hits."""
    y = tmp_path / "turns.yaml"
    y.write_text(YAML + f"save_decode_cache: {str(decode).lower()}\n")
    vc = s.vllm_config(env["model"], y, retention=retention)
    cfg = s.kv_cache_config(vc, num_blocks=7)
    sched = h.make_scheduler(vc, cfg)
    worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, cfg)
    runner = h.Runner(cfg, worker)
    turn1 = np.random.default_rng(9).integers(0, 128, 150).tolist()
    out = h.run(sched, runner, [h.make_request("t1", turn1, 70)])["t1"]
    turn2 = turn1 + out + [5, 6, 7]
    h.settle(sched, runner, turn2)             # the first turn's saves are all stored
    assert sched.reset_prefix_cache()          # the device cache forgot the first turn
    h.run(sched, runner, [h.make_request("t2", turn2, 4)])
    worker.shutdown()
    st = sched.connector.sched.stats
    assert runner.bad == [] and st.hits == 1
    # the answer was saved, up to its last computed token (219, inside a block)
    assert st.hit_tokens == (len(turn1) + len(out) - 1 if decode else 128)


def test_stats_reach_vllms_logging_and_prometheus_with_hit_sources(env: dict[str, Any]) -> None:
    from prometheus_client import REGISTRY
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorLogging,
        KVConnectorProm,
    )
    from vllm.v1.metrics.cache_hit_source import CacheHitSource

    sched = h.make_scheduler(env["vc"], env["cfg"])
    runner = h.Runner(env["cfg"], _worker(env))
    h.run(sched, runner, _requests(3), evict_every=1)
    runner.connector.shutdown()
    logging_ = KVConnectorLogging(env["vc"].kv_transfer_config)
    prom = KVConnectorProm(env["vc"], ["model_name", "engine"], {0: ["tiny", "0"]})
    by_source: dict[Any, int] = {}
    for st in runner.sched_stats:
        if st.kv_connector_stats:
            logging_.observe(st.kv_connector_stats)
            prom.observe(st.kv_connector_stats, 0)
        cp = st.connector_prefix_cache_stats
        for src, n in ((cp.hits_by_source or {}) if cp is not None else {}).items():
            by_source[src] = by_source.get(src, 0) + n
    st = sched.connector.sched.stats
    totals = logging_.transfer_stats_accumulator.reduce()
    assert totals["load_jobs"] == st.hits >= 3 and totals["saved_objects"] > 0
    assert totals["loaded_from_host"] > 0 and totals.get("failed_loads", 0) == 0
    got = REGISTRY.get_sample_value("vllm:hybrid_connector_load_jobs_total",
                                    {"model_name": "tiny", "engine": "0"})
    assert got == totals["load_jobs"]
    assert by_source == {CacheHitSource.HOST: st.loaded_tokens}


def test_a_restarted_engine_hits_on_what_its_nvme_tier_kept(env: dict[str, Any], tmp_path: Path) -> None:
    """Engine 1 serves prompts and stops; engine 2 (new scheduler, new worker, empty vLLM
    cache) starts over the same NVMe directory: the worker reports what its tier holds, the
    scheduler's index adopts and re-links it, and a repeated prompt hits, byte-checked."""
    y = tmp_path / "nvme.yaml"
    y.write_text(YAML.split("pools:")[0] + TIER_YAML["disk"].format(dir=tmp_path / "nvme", url=""))
    vc = copy.deepcopy(env["vc"])
    vc.kv_transfer_config.kv_connector_extra_config = {"config_file": str(y)}
    prompts = _requests(4, 3)
    first = h.make_scheduler(vc, env["cfg"])
    runner = h.Runner(env["cfg"], _worker(env, vc))
    h.run(first, runner, prompts)
    saved = dict(first.connector.sched.stats.saved_objects)
    runner.connector.shutdown()
    first.connector.shutdown()

    again = h.make_scheduler(vc, env["cfg"])
    runner = h.Runner(env["cfg"], _worker(env, vc))
    warm = h.make_request("warm", list(range(40)), 2)   # the first step carries the inventory
    repeat = [h.make_request(f"again{i}", list(r.prompt_token_ids), 2) for i, r in enumerate(prompts)]
    h.run(again, runner, [warm, *repeat])
    runner.connector.shutdown()
    st = again.connector.sched.stats
    assert saved["state"] > 0 and st.restored.get("state", 0) > 0 and st.restored.get("kv", 0) > 0
    assert runner.bad == [] and st.hits >= 2 and set(st.hit_sources) == {"nvme"}
    again.connector.sched.index.check_integrity()


def test_a_pure_mamba2_model_gets_state_only_hits(tmp_path: Path) -> None:
    """No attention layers: vLLM packs the Mamba layers of its one group layer-major; the
    connector saves states only (no KV objects) and every hit is a checkpoint."""
    y = tmp_path / "ssm.yaml"
    y.write_text(YAML)
    vc = s.vllm_config(s.tiny_mamba2(tmp_path), y)
    cfg = s.kv_cache_config(vc, num_blocks=7)
    native = copy.deepcopy(vc)
    native.kv_transfer_config = None
    base_runner = h.Runner(cfg, None)
    base = h.run(h.make_scheduler(native, cfg), base_runner, _requests(3), evict_every=1)
    sched = h.make_scheduler(vc, cfg)
    runner = h.Runner(cfg, KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, cfg))
    outs = h.run(sched, runner, _requests(3), evict_every=1)
    runner.connector.shutdown()
    st = sched.connector.sched.stats
    assert base_runner.bad == [] and runner.bad == [] and outs == base
    assert st.hits >= 1 and st.hits_without_state == 0 and set(st.saved_objects) == {"state"}
    assert runner.computed_tokens < base_runner.computed_tokens


def test_a_second_engine_hits_on_what_the_first_stored_on_a_shared_redis(
        env: dict[str, Any], tmp_path: Path, redis_server: str) -> None:
    """Two engines (scheduler + worker each, their own host tiers) share a real redis-server:
    the second discovers the first's objects through the shared tier's manifests and loads
    them from redis, byte-checked (vLLM's block hashes agree: one NONE_HASH per process)."""
    y = tmp_path / "shared.yaml"
    y.write_text(YAML.split("pools:")[0] + f"remote_url: {redis_server}\n"
                 "pools:\n  host: {kv: 4MB, state: 2MB}\n  remote: {kv: 8MB, state: 8MB}\n")
    vc = copy.deepcopy(env["vc"])
    vc.kv_transfer_config.kv_connector_extra_config = {"config_file": str(y)}
    prompts = _requests(21, 3)
    first = h.make_scheduler(vc, env["cfg"])
    r1 = h.Runner(env["cfg"], _worker(env, vc))
    h.run(first, r1, prompts)
    r1.connector.shutdown()
    second = h.make_scheduler(vc, env["cfg"])
    r2 = h.Runner(env["cfg"], _worker(env, vc))
    h.run(second, r2, [h.make_request(f"b{i}", list(r.prompt_token_ids), 2) for i, r in enumerate(prompts)])
    r2.connector.shutdown()
    st = second.connector.sched.stats
    assert r1.bad == [] and r2.bad == []
    assert st.hits >= 1 and st.hit_sources.get("remote", 0) > 0
    first.connector.shutdown()
    second.connector.shutdown()
