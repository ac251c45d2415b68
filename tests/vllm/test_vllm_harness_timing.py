"""The vLLM test harness gives the same hits however fast our worker's tier threads run:
``Runner`` hands the worker's op reports to vLLM one step after their ops (the bench's
``StepReports``), so a save reaches the index at the same step on a busy machine as on an
idle one. Checked at the two extremes (every op inline; every op held on its lanes until
the runner flushes them). Before, the harness took whatever the threads had finished: with
held lanes the saves of a request landed after the next request's lookup and it missed,
so any test asserting hits after ``run`` depended on the machine's load."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import vllm_harness as h
import vllm_support as s
from op_speed import held, immediate

pytest.importorskip("vllm")


def _serve(root: Path) -> dict[str, Any]:
    root.mkdir()
    sched, _, runner = h.engine(root, s.BASE_YAML, retention=0, num_blocks=7)
    rng = np.random.default_rng(5)
    base = rng.integers(0, 128, 300).tolist()
    reqs = [h.make_request(f"r{i}", base[: 120 + 37 * i] + rng.integers(0, 128, 20).tolist(), 6)
            for i in range(4)]
    try:
        h.run(sched, runner, reqs, evict_every=1)  # hits must come from the connector
    finally:
        runner.connector.shutdown()
        sched.connector.shutdown()
    st = sched.connector.sched.stats
    return {"bad": runner.bad, "hits": st.hits, "hit_tokens": st.hit_tokens,
            "computed": runner.computed_tokens, "checked": runner.checked_tokens,
            "saved": dict(st.saved_objects)}


def test_harness_hits_do_not_depend_on_when_tier_ops_complete(tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as mp:
        immediate(mp)
        fast = _serve(tmp_path / "fast")
    go = threading.Event()
    try:
        with pytest.MonkeyPatch.context() as mp:
            held(mp, go, hold_s=2.0)  # without the runner's flush each batch waits 2 s
            slow = _serve(tmp_path / "slow")
    finally:
        go.set()
    assert fast["bad"] == [] and fast["hits"] >= 2
    assert slow == fast
