"""End to end with real compute: vLLM 0.33.0's Scheduler (scheduler-role connector) in this
process, the worker-role connector and a tiny transformers model runner in another
(``vllm_procs``), concurrent shared-prefix requests with chunked prefill, preemption and
an abort. Greedy tokens with the connector equal those without it, the connector's hits
are counted and never attention-only, and every resumed request's KV and state tensors
equal a full prefill's. Nemotron-H (Mamba2) and Qwen3-Next (GDN)."""

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
from vllm_model_runner import TOL  # noqa: E402

YAML = "chunk_size: 64\nhash_block_size: 32\nalignment: 32\npools:\n  host: {kv: 4MB, state: 2MB}\n"


def _requests(seed: int, n: int, max_tokens: int = 40) -> list[Any]:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 128, 300).tolist()
    return [h.make_request(f"r{i}", base[: 100 + (i * 37) % 120] + rng.integers(0, 128, 16).tolist(),
                           max_tokens)
            for i in range(n)]


def _serve(vc: Any, cfg: Any, model_dir: Path, connector: bool, lose: bool = False,
           n: int = 8, max_tokens: int = 40, async_scheduling: bool = False
           ) -> tuple[dict[str, list[int]], dict[str, Any], Any]:
    v = vc
    if not connector:
        v = copy.deepcopy(vc)
        v.kv_transfer_config = None
    sched = h.make_scheduler(v, cfg, async_scheduling)
    worker = vp.WorkerProcess(vc, cfg, str(model_dir), connector=connector, lose=lose)
    try:
        outs = h.run_mixed(sched, worker, _requests(5, n, max_tokens), arrive_every=2,
                           abort={"r3": 25}, pipelined=async_scheduling)
        report = worker.report()
    finally:
        worker.close()
    outs.pop("r3", None)  # aborted: its partial output depends on the schedule
    return outs, report, sched


@pytest.mark.parametrize(("arch", "async_scheduling"),
                         [("nemotron_h", False), ("qwen3_next", False), ("nemotron_h", True)],
                         ids=["nemotron_h", "qwen3_next", "nemotron_h-async"])
def test_real_compute_through_vllms_scheduler_in_two_processes(
        tmp_path: Path, arch: str, async_scheduling: bool) -> None:
    """``async``: vLLM's ``AsyncScheduler`` (its GPU default), two steps in flight."""
    y = tmp_path / "hybrid.yaml"
    y.write_text(YAML)
    model_dir = s.MODELS[arch](tmp_path)
    vc = s.vllm_config(model_dir, y, max_len=320)
    cfg = s.kv_cache_config(vc, num_blocks=5)  # room for ~2 requests: preemptions
    base, base_rep, _ = _serve(vc, cfg, model_dir, connector=False, async_scheduling=async_scheduling)
    outs, rep, sched = _serve(vc, cfg, model_dir, connector=True, async_scheduling=async_scheduling)
    st = sched.connector.sched.stats
    assert base_rep["bad"] == [] and rep["bad"] == [], rep["bad"][:3]
    assert outs == base and len(outs) == 7                  # same greedy tokens
    assert st.hits >= 3 and st.failed_loads == 0 and st.hits_without_state == 0
    assert rep["computed"] < base_rep["computed"]           # hits were not recomputed
    assert rep["preempted"] > 0 and rep["resumed"] > 0       # preemption and resumes ran
    assert rep["max_err"] <= TOL
    sched.connector.sched.index.check_integrity()


def test_a_lost_load_is_recomputed_with_the_same_tokens(tmp_path: Path) -> None:
    y = tmp_path / "hybrid.yaml"
    y.write_text(YAML)
    model_dir = s.tiny_nemotron_h(tmp_path)
    vc = s.vllm_config(model_dir, y)
    cfg = s.kv_cache_config(vc, num_blocks=7)
    base, _, _ = _serve(vc, cfg, model_dir, connector=False, n=6, max_tokens=6)
    outs, rep, sched = _serve(vc, cfg, model_dir, connector=True, lose=True, n=6, max_tokens=6)
    st = sched.connector.sched.stats
    assert rep["bad"] == [] and outs == base
    assert st.failed_loads >= 1 and st.hits == 0
