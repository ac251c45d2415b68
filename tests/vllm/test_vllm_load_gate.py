"""The load gate (``load_gate``) through vLLM 0.33.0's own Scheduler: with every object on
the NVMe tier, a disk-held state that extends vLLM's local hit by few tokens is refused
(vLLM recomputes them: cheaper than the read), one that extends it by many is taken."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402

# tiny Nemotron-H: KV 256 B/token, a state 10,496 B. At 4.14e7 FLOPs per token and 445
# TFLOP/s one token's prefill takes as long as reading ~450 B from NVMe (6 GB/s + the
# host hop at 25): 27 tokens (12 KB) < the state + 27 tokens of KV (17 KB), but 219 tokens
# (99 KB) > all 219 tokens' KV + the state (67 KB) and > the shallower hit at 128.
YAML = """chunk_size: 64
hash_block_size: 32
alignment: 32
local_cpu: false
local_disk: {dir}
max_local_disk_size: 8MB
disk_fsync: false
pools:
  disk: {{kv: 4MB, state: 4MB}}
replay: false
save_decode_cache: true
load_gate: {{enabled: {on}, flops_per_token: 41400000.0}}
"""


@pytest.mark.parametrize("forget, on, hit", [
    (False, "true", 0),     # local hit 192: the state at 219 adds 27 tokens, refused
    (True, "true", 219),    # local hit 0: 219 tokens, taken
    (False, "false", 219),  # gate off: taken whatever it costs
])
def test_a_disk_state_is_loaded_only_when_it_saves_more_than_its_read(
        tmp_path: Path, forget: bool, on: str, hit: int) -> None:
    sched, worker, runner = h.engine(tmp_path, YAML.format(dir=tmp_path / "nvme", on=on),
                                     retention=None, num_blocks=32, name="c.yaml")
    try:
        turn1 = np.random.default_rng(9).integers(0, 128, 150).tolist()
        ans = h.run(sched, runner, [h.make_request("t1", turn1, 70)])["t1"]
        turn2 = turn1 + ans + [5, 6, 7]
        assert h.settle(sched, runner, turn2) == 219  # KV and the state at 219 on NVMe
        if forget:
            assert sched.reset_prefix_cache()  # vLLM's local hit: 0 (else its blocks: 192)
        h.run(sched, runner, [h.make_request("t2", turn2, 4)])
    finally:
        worker.shutdown()
    st = sched.connector.sched.stats
    assert runner.bad == [], runner.bad[:3]
    assert st.failed_loads == 0
    assert (st.hits, st.hit_tokens) == ((1, hit) if hit else (0, 0))
    if hit:
        assert st.hit_sources.get("nvme", 0) > 0
