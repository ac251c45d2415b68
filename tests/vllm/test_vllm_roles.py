"""vLLM's ``kv_role`` through vLLM 0.33.0's own Scheduler: prefill/decode disaggregation over
a shared tier (a real redis-server), the way LMCache and MooncakeStore are deployed for it.
The prefill instance (``kv_producer``) stores; the decode instance (``kv_consumer``) loads
what the producer stored and stores nothing, neither KV nor states nor its requests' exact
end states (vLLM finalizes partial tails for producers only, and LMCache and MooncakeStore
skip a consumer's saves). Before, the connector ignored ``kv_role``: a consumer wrote every
prompt and answer to the shared tier and held vLLM's blocks for its tails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402

SHARED = ("chunk_size: 64\nhash_block_size: 32\nalignment: 32\nreplay: false\n"
          "save_decode_cache: true\nremote_url: {url}\n"
          "pools:\n  host: {{kv: 4MB, state: 2MB}}\n  remote: {{kv: 8MB, state: 8MB}}\n")


def _engine(root: Path, url: str, role: str) -> tuple[Any, Any, h.Runner]:
    root.mkdir()

    def configure(vc: Any) -> None:
        vc.kv_transfer_config.kv_role = role

    return h.engine(root, SHARED.format(url=url), retention=None, num_blocks=16,
                    name="pd.yaml", configure=configure,
                    extra={"model_id": "org/tiny@pd"})  # both instances: the same weights


def _prompts(n: int) -> list[list[int]]:
    rng = np.random.default_rng(8)
    system = rng.integers(0, 128, 64).tolist()
    return [system + rng.integers(0, 128, 70 + 5 * i).tolist() for i in range(n)]


def test_a_decode_instance_loads_what_prefill_stored_and_stores_nothing(
        tmp_path: Path, redis_server: str) -> None:
    prompts = _prompts(3)
    sched, worker, runner = _engine(tmp_path / "prefill", redis_server, "kv_producer")
    try:
        h.run(sched, runner, [h.make_request(f"p{i}", p, 1) for i, p in enumerate(prompts)])
        h.idle(sched, runner)
        assert sched.connector.sched.stats.saved_objects["state"] > 0
    finally:
        worker.shutdown()
        sched.connector.shutdown()
    import redis

    shared = redis.Redis.from_url(redis_server)
    keys = shared.dbsize()
    sched, worker, runner = _engine(tmp_path / "decode", redis_server, "kv_consumer")
    side = sched.connector.sched
    try:
        h.run(sched, runner, [h.make_request(f"d{i}", p, 6) for i, p in enumerate(prompts)])
        h.idle(sched, runner)
        st = side.stats
        assert st.hits >= len(prompts) and st.hit_sources.get("remote", 0) > 0
        assert sum(st.saved_objects.values()) == 0  # nothing written, tails included
        # all it holds came from the shared tier (a read may be kept in its host tier)
        assert side.index.ledger.entries
        assert all(e.shared for e in side.index.ledger.entries.values())
        assert shared.dbsize() == keys  # it wrote nothing there
        assert not sched.requests  # no request's blocks held for a tail copy
    finally:
        worker.shutdown()
        sched.connector.shutdown()
        shared.close()
    assert runner.bad == []
