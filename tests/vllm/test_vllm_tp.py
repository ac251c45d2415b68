"""Tensor parallelism under vLLM's scheduler: two worker processes, each with its own shard
of every KV block and state page (their bytes differ) and its own tiers; their outputs are
merged by vLLM's ``KVOutputAggregator``. Hits load on both ranks, byte-checked; a load lost
on one rank only is recomputed on both; each rank's tiers hold exactly what the scheduler's
ledger says (the ranks never diverge), also after a connector reset."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402
import vllm_procs as vp  # noqa: E402
import vllm_support as s  # noqa: E402

YAML = "chunk_size: 64\nhash_block_size: 32\nalignment: 32\npools:\n  host: {kv: 4MB, state: 2MB}\n"


def _requests(n: int = 6) -> list[Any]:
    rng = np.random.default_rng(8)
    base = rng.integers(0, 128, 300).tolist()
    return [h.make_request(f"r{i}", base[: 120 + (i * 37) % 160] + rng.integers(0, 128, 20).tolist(), 6)
            for i in range(n)]


@pytest.fixture(scope="module")
def tp2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tp")
    y = root / "hybrid.yaml"
    y.write_text(YAML)
    vc = s.vllm_config(s.tiny_nemotron_h(root), y, tp=2)
    return {"vc": vc, "cfg": s.kv_cache_config(vc, num_blocks=7)}


def _serve(env: dict[str, Any], connector: bool, lose_on: tuple[int, ...] = ()
           ) -> tuple[dict[str, list[int]], list[dict[str, Any]], Any]:
    vc = env["vc"]
    if not connector:
        vc = copy.deepcopy(vc)
        vc.kv_transfer_config = None
    sched = h.make_scheduler(vc, env["cfg"])
    if not connector:
        runner = h.Runner(env["cfg"], None)
        return h.run(sched, runner, _requests(), evict_every=2), [{"bad": runner.bad}], sched
    workers = vp.TPWorkers(env["vc"], env["cfg"], 2, lose_on)
    try:
        outs = h.run(sched, workers, _requests(), evict_every=2)
        return outs, workers.reports(), sched
    finally:
        workers.close()


def _ledger(sched: Any) -> dict[Any, str]:
    ix = sched.connector.sched.index
    with ix.backend.lock:
        return {k: ix.ledger.where(k) for k, e in ix.ledger.entries.items() if not e.pending}


def test_two_ranks_load_their_own_shards_and_never_diverge(tp2: dict[str, Any]) -> None:
    base, _, _ = _serve(tp2, connector=False)
    outs, reps, sched = _serve(tp2, connector=True)
    st = sched.connector.sched.stats
    assert all(r["bad"] == [] for r in reps), [r["bad"][:2] for r in reps]
    assert outs == base and st.hits >= 3 and st.failed_loads == 0
    assert sched.connector.geometry.tp_size == 2
    want = _ledger(sched)
    assert want and all(r["held"] == want for r in reps)   # each rank = the ledger


def test_a_shard_lost_on_one_rank_is_recomputed_on_both(tp2: dict[str, Any]) -> None:
    base, _, _ = _serve(tp2, connector=False)
    outs, reps, sched = _serve(tp2, connector=True, lose_on=(1,))
    st = sched.connector.sched.stats
    assert all(r["bad"] == [] for r in reps) and outs == base
    assert st.failed_loads >= 1 and st.hits == 0
    assert reps[1]["held"] == {}                           # rank 1 lost everything
    sched.connector.sched.index.check_integrity()


def test_a_reset_empties_every_ranks_tiers(tp2: dict[str, Any]) -> None:
    """vLLM's connector reset (``reset_prefix_cache(reset_connector=True)``): the removals
    reach both ranks, whose tiers end empty, as the scheduler's index and ledger do."""
    sched = h.make_scheduler(tp2["vc"], tp2["cfg"])
    workers = vp.TPWorkers(tp2["vc"], tp2["cfg"], 2)
    try:
        h.run(sched, workers, _requests(), evict_every=2)
        assert all(r["held"] for r in workers.reports())
        assert sched.reset_prefix_cache(reset_connector=True)
        h.idle(sched, workers)  # the next steps carry the removals (and the last puts' reports)
        reps = workers.reports()
        assert not _ledger(sched) and len(sched.connector.sched.index.table) == 0
        assert all(r["held"] == {} and r["bad"] == [] for r in reps)
    finally:
        workers.close()
