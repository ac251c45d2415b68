"""Under vLLM 0.33's ``AsyncScheduler``, its default on a GPU (``VllmConfig`` turns
``async_scheduling`` on unless something is incompatible), driven as
``EngineCore.step_with_batch_queue`` drives it: step t+1 is scheduled before step t's
output is processed, so a decode step is planned while the token it computes is still a
placeholder, and a request that stops at step t has step t+1 in flight when vLLM calls
``request_finished``. Stored answers must still land exactly: the KV chunk a pending token
ends is saved a step later (``test_vllm_answers``, ``async``), and a turn that stops at a
stop token leaves its state after that token, which the step in flight computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402
import vllm_support as s  # noqa: E402

PROMPT = 150
OUT = 70
YAML = s.BASE_YAML + "save_decode_cache: true\n"


def _answer(root: Path, turn1: list[int]) -> list[int]:
    """The runner's tokens for ``turn1`` (a function of the prefix, the same in any engine)."""
    sched, worker, runner = h.engine(root, YAML, retention=None, num_blocks=8, name="learn.yaml")
    try:
        return h.run(sched, runner, [h.make_request("t0", turn1, OUT)])["t0"]
    finally:
        worker.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_turn_that_stops_at_a_stop_token_leaves_its_exact_end(
        tmp_path: Path, async_scheduling: bool) -> None:
    """Turn 1 stops at a stop token, its k-th generated token, after 150 + k + 1 tokens.
    In sync mode vLLM never computes the stop token, so the exact end is 150 + k. With
    async scheduling the step in flight computes it: the end is 150 + k + 1, saved once
    that step is done (vLLM keeps the blocks until then). Turn 2 (turn 1, its answer and
    3 tokens) hits exactly there, byte-checked. Before, a request with a token in flight
    saved no end state and turn 2 hit at the chunk boundary below (150 + k rounded down)."""
    turn1 = np.random.default_rng(9).integers(0, 128, PROMPT).tolist()
    (tmp_path / "learn").mkdir()
    full = _answer(tmp_path / "learn", turn1)
    k = next(i for i in range(45, OUT) if full[i] not in full[:i])  # a first occurrence
    stop = full[k]
    end = PROMPT + k + (1 if async_scheduling else 0)
    sched, worker, runner = h.engine(tmp_path, YAML, retention=None, num_blocks=8,
                                     name="async.yaml", async_scheduling=async_scheduling)
    try:
        ans = h.run(sched, runner, [h.make_request("t1", turn1, OUT, [stop])],
                    pipelined=async_scheduling)["t1"]
        assert ans == full[: k + 1]
        turn2 = turn1 + ans + [5, 6, 7]
        assert h.settle(sched, runner, turn2) == end
        computed = h.second_turn(sched, runner, turn2, pipelined=async_scheduling)
    finally:
        worker.shutdown()
    st = sched.connector.sched.stats
    assert runner.bad == [], runner.bad[:3]  # KV of [0, end) and the state at end, exact
    assert st.hits == 1 and st.failed_loads == 0 and st.hit_tokens == end
    assert computed == len(turn2) - end + 3
    assert not sched.requests  # the held blocks were released
