"""A run of ours in the head-to-head has the same figures however fast its worker's tier
threads run: after each step the runner waits for the tier ops and hands their reports to
vLLM in the next step, never in the step that issued them (``run.StepReports``). Checked
at the two extremes of thread speed: every op run in the submitting thread (done before
the worker reports in its own step) and every op held on its lanes until someone calls
``Executor.flush``. Before the fix the immediate run's saves reached the index a step
earlier than the held run's, and later lookups saw different objects (0.25x of this
trace: 5,074 vs 5,087 hit tokens; the quick's chat_edits 1x: 17,303 vs 17,017; an
unhindered run fell anywhere between, run to run. At 1x this is the check that replaced
the settle's own test: before any settle, held saves landed only at the end of the run.)"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from op_speed import held, immediate

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ("hit_tokens", "vllm_hits", "recomputed", "loaded_bytes", "stored_bytes",
           "held_bytes", "peak_bytes", "steps", "external_hit_tokens", "ours", "ttft")


def _run(tmp: Path, multiple: float) -> dict[str, Any]:
    from hybrid_connector.bench.vllm_peers import sweep as vp

    cfg = vp.PeersConfig(traces={"chat_edits": (16, 4)}, multiples=(multiple,), concurrency=2,
                         peers=("ours-pooled",))
    doc = vp.run_sweep(cfg, progress=False, work=tmp, configs=ROOT / "configs")
    (row,) = doc["rows"]
    return {k: row[k] for k in FIGURES}


@pytest.mark.parametrize("multiple", [0.25, 1.0])  # evicting, and not
def test_ours_figures_do_not_depend_on_when_its_tier_ops_complete(
        tmp_path: Path, multiple: float) -> None:
    pytest.importorskip("vllm")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    with pytest.MonkeyPatch.context() as mp:
        immediate(mp)
        fast = _run(tmp_path / "fast", multiple)
    go = threading.Event()
    try:
        with pytest.MonkeyPatch.context() as mp:
            held(mp, go)
            slow = _run(tmp_path / "slow", multiple)
    finally:
        go.set()
    assert slow == fast
    assert fast["hit_tokens"] > 0 and fast["loaded_bytes"] > 0  # the connector served hits
