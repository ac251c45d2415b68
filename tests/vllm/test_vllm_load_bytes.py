"""A load reads only what vLLM lacks, through vLLM 0.33.0's own Scheduler: when vLLM's
device cache still holds a prefix of the hit (its local hit), the KV chunks wholly below
it are not read from the host tier (on a GPU each read is a host-to-device copy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402
import vllm_support as s  # noqa: E402

from hybrid_connector.core.keys import ObjectKind  # noqa: E402

YAML = s.BASE_YAML + 'save_decode_cache: true\n'


def test_kv_chunks_below_vllms_local_hit_are_not_read(tmp_path: Path) -> None:
    """Turn 1 (150 + 70 tokens) is stored up to its exact end, 219; vLLM's device cache
    keeps its blocks, so turn 2's local hit is 192 (its last retained boundary) and the
    connector's hit 219: the load reads the chunk over [192, 219) and the state at 219,
    not the chunks of [0, 192)."""
    sched, worker, runner = h.engine(tmp_path, YAML, retention=None, num_blocks=32, name="c.yaml")
    read: list[Any] = []
    rank = worker.worker.worker
    real_load = rank.load

    def load(plan_id: int, keys: Any, tiers: Any, sizes: Any) -> Any:
        read.extend(keys)
        return real_load(plan_id, keys, tiers, sizes)

    rank.load = load
    try:
        turn1 = np.random.default_rng(9).integers(0, 128, 150).tolist()
        ans = h.run(sched, runner, [h.make_request("t1", turn1, 70)])["t1"]
        turn2 = turn1 + ans + [5, 6, 7]
        assert h.settle(sched, runner, turn2) == 219
        h.run(sched, runner, [h.make_request("t2", turn2, 4)])
    finally:
        worker.shutdown()
    st = sched.connector.sched.stats
    assert runner.bad == [], runner.bad[:3]  # the hit is still byte-exact
    assert st.hits == 1 and st.hit_tokens == 219 and st.loaded_tokens == 219 - 192
    kv = sorted((k.start, k.end) for k in read if k.kind is ObjectKind.KV)
    assert kv and all(e > 192 for _, e in kv), kv  # nothing wholly below the local hit
    assert [k.end for k in read if k.kind is ObjectKind.STATE] == [219]
