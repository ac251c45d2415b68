"""The connector as a child of vLLM 0.33.0's own ``MultiConnector``, the way deployments
combine an offloading connector with another one (P/D disaggregation pairs NixlConnector
with an offloading connector so). vLLM's ``MultiConnector`` wraps the metadata both ways
(``MultiKVConnectorMetadata``, ``MultiKVConnectorWorkerMetadata``), counts the held
requests' async saves over its children, forwards partial tails, resets and KV events. Here
it runs through vLLM's own Scheduler with our connector as its child, byte-checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402
import vllm_support as s  # noqa: E402

from hybrid_connector.bench.vllm_peers.run import StepReports  # noqa: E402

YAML = s.BASE_YAML + "save_decode_cache: true\n"  # answers' exact end states: held blocks


def _engine(root: Path, multi: bool = True, events: bool = False
            ) -> tuple[Any, Any, h.Runner, Any]:
    """vLLM's Scheduler and worker-side connector, both ``MultiConnector`` over ours (else
    ours alone); and our scheduler side."""
    from vllm.config import KVEventsConfig, KVTransferConfig

    def configure(vc: Any) -> None:
        if multi:
            ours = vc.kv_transfer_config
            child = {"kv_connector": ours.kv_connector,
                     "kv_connector_module_path": ours.kv_connector_module_path,
                     "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                     "kv_connector_extra_config": dict(ours.kv_connector_extra_config)}
            vc.kv_transfer_config = KVTransferConfig(
                kv_connector="MultiConnector", kv_role="kv_both",
                kv_load_failure_policy="recompute",
                kv_connector_extra_config={"connectors": [child]})
        if events:
            vc.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="null")

    root.mkdir(exist_ok=True)
    sched, worker, runner = h.engine(root, YAML, retention=None, num_blocks=16,
                                     name="multi.yaml", configure=configure)
    if not multi:
        return sched, worker, runner, sched.connector.sched
    assert type(sched.connector).__name__ == "MultiConnector"
    # op reports one step after their ops, as the harness does for our own connector
    runner.reports = StepReports(worker.sub_connectors[0].worker)
    return sched, worker, runner, sched.connector.sub_connectors[0].sched


def _scenario(root: Path, multi: bool) -> dict[str, Any]:
    """Two conversations that share a prefix, each turn served after vLLM's own cache
    forgot the last (hits come from our tiers; answers end inside blocks, so their exact
    end states hold vLLM's blocks until copied), then a connector reset."""
    sched, worker, runner, side = _engine(root, multi)
    rng = np.random.default_rng(5)
    system = rng.integers(0, 128, 100).tolist()
    try:
        history = {u: system + rng.integers(0, 128, 30 + 9 * u).tolist() for u in range(2)}
        for turn in range(3):
            for u in range(2):
                assert sched.reset_prefix_cache()
                out = h.run(sched, runner, [h.make_request(f"u{u}t{turn}", history[u], 5)])
                history[u] = history[u] + out[f"u{u}t{turn}"] + [7, turn, u]
        h.idle(sched, runner)
        pool = sched.kv_cache_manager.block_pool
        got = {"hit_tokens": side.stats.hit_tokens, "loads": side.stats.loads,
               "saved": dict(side.stats.saved_objects), "indexed": len(side.index.table),
               "requests_left": len(sched.requests),
               "blocks_in_use": pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()}
        assert sched.reset_prefix_cache(reset_connector=True)  # reaches our index
        h.idle(sched, runner)
        got["indexed_after_reset"] = len(side.index.table)
    finally:
        worker.shutdown()
    assert runner.bad == [] and runner.checked_tokens > 0
    return got


def test_multi_connector_serves_and_saves_as_ours_alone(tmp_path: Path) -> None:
    alone = _scenario(tmp_path / "alone", multi=False)
    wrapped = _scenario(tmp_path / "multi", multi=True)
    assert alone["hit_tokens"] > 0 and alone["saved"]["state"] > 0
    assert alone["requests_left"] == 0 and alone["blocks_in_use"] == 0
    assert alone["indexed_after_reset"] == 0
    assert wrapped == alone


def test_kv_events_through_vllms_multi_connector(tmp_path: Path) -> None:
    sched, worker, runner, side = _engine(tmp_path, events=True)
    got: list[Any] = []
    publish = sched.kv_event_publisher.publish
    sched.kv_event_publisher.publish = lambda b: (got.extend(b.events), publish(b))
    p = np.random.default_rng(6).integers(0, 128, 120).tolist()
    try:
        h.run(sched, runner, [h.make_request("e0", p, 2)])
        h.idle(sched, runner)
        assert side.events is not None
        ours = [e for e in got if getattr(e, "medium", None) == "CPU"]
        assert ours and {type(e).__name__ for e in ours} == {"BlockStored"}
    finally:
        worker.shutdown()
    assert runner.bad == []
