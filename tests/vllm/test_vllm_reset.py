"""vLLM's connector reset through vLLM 0.33.0's own Scheduler: ``reset_prefix_cache(
reset_connector=True)``, what ``pause_generation(clear_cache=True)`` runs around a weight
update (RL loops). Everything stored before is forgotten and removed from the tiers (puts
still in flight at the reset included); what is computed after it is stored and served
again. The runner's model changes with the "weights" at the reset, so a byte stored before
it and served after fails the runner's check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402
import vllm_support as s  # noqa: E402

PROMPT = 150


def _held(worker: Any) -> list[Any]:
    """What the worker's host tier holds."""
    return worker.worker.worker.executor.tiers["host"].held_keys()


def _hit(sched: Any, runner: h.Runner, rid: str, prompt: list[int]) -> int:
    """Tokens the connector served ``rid`` (vLLM's own cache emptied first)."""
    st = sched.connector.sched.stats
    assert sched.reset_prefix_cache()
    before = st.hit_tokens
    h.run(sched, runner, [h.make_request(rid, prompt, 1)])
    h.idle(sched, runner)
    return int(st.hit_tokens - before)


def test_a_reset_forgets_everything_stored_before_it(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    sched, worker, runner = h.engine(tmp_path, s.BASE_YAML, retention=None, num_blocks=16,
                                     name="reset.yaml")
    side = sched.connector.sched
    try:
        p = np.random.default_rng(11).integers(0, 128, PROMPT).tolist()
        _hit(sched, runner, "v1", p)
        assert _hit(sched, runner, "v1 again", p) >= 128  # the control: stored and served
        h.run(sched, runner, [h.make_request("v1 last", p + [5] * 40, 1)])  # tail puts in flight
        assert side.index.table.pending_keys()
        monkeypatch.setattr(h, "_adapter", lambda nr: b"weights v2")  # the update
        assert sched.reset_prefix_cache(reset_connector=True)
        h.idle(sched, runner)
        assert len(side.index.table) == 0 and not side.index.ledger.entries
        assert _held(worker) == []  # the workers removed the bytes too
        side.index.check_integrity()
        assert _hit(sched, runner, "v2", p) == 0
        assert _hit(sched, runner, "v2 again", p) >= 128  # stored again, after the update
    finally:
        worker.shutdown()
    assert runner.bad == []


def test_a_restart_never_adopts_what_was_saved_after_an_in_memory_weight_update(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An RL loop updates the weights in memory, so the model's files, which the key
    fingerprint is made from, still name the old ones. What is saved after the reset is
    keyed under a new epoch: an engine restarted on those files (the old weights) must not
    adopt it from the NVMe tier. Before, it adopted and served it (the runner's check
    failed)."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    yaml = tmp_path / "nvme.yaml"
    yaml.write_text(s.BASE_YAML.split("pools:")[0] + s.DISK_YAML.format(dir=tmp_path / "nvme"))
    model = s.tiny_nemotron_h(tmp_path)
    vc = s.vllm_config(model, yaml)
    cfg = s.kv_cache_config(vc, num_blocks=16)
    p = np.random.default_rng(12).integers(0, 128, PROMPT).tolist()

    def engine() -> tuple[Any, h.Runner]:
        return h.make_scheduler(vc, cfg), h.Runner(
            cfg, KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, cfg))

    sched, runner = engine()
    _hit(sched, runner, "w1", p)
    monkeypatch.setattr(h, "_adapter", lambda nr: b"weights v2")  # the in-memory update
    assert sched.reset_prefix_cache(reset_connector=True)
    h.idle(sched, runner)
    _hit(sched, runner, "w2", p)  # stored again, with the new weights
    h.idle(sched, runner)
    assert sched.connector.sched.stats.saved_objects["state"] >= 2
    runner.connector.shutdown()
    sched.connector.shutdown()
    assert runner.bad == []
    monkeypatch.undo()  # the restarted engine loads the files: the old weights
    sched, runner = engine()
    try:
        # a first request of other tokens: its first step carries the NVMe inventory
        h.run(sched, runner, [h.make_request("warm", list(range(40)), 2)])
        got = _hit(sched, runner, "after restart", p)
        assert sum(sched.connector.sched.stats.restored.values()) == 0 and got == 0
    finally:
        runner.connector.shutdown()
        sched.connector.shutdown()
    assert runner.bad == []
