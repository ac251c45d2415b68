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


def test_concurrent_turns_stopping_at_stop_tokens_with_preemption_and_an_abort(
        tmp_path: Path) -> None:
    """Two waves under ``AsyncScheduler``: eight first turns over a shared prefix, arriving
    every step into a device cache too small for them (preemptions), each stopping at a stop
    token of its own or at its length, one aborted; then each one's next turn (its prompt,
    its answer, 3 tokens) after vLLM's own cache forgot the first wave. Every byte a hit
    restored is checked, the index stays consistent and no blocks stay held; after the
    first wave the index serves most next turns past their first turn's prompt (the stored
    answers and their exact ends; before, none)."""
    rng = np.random.default_rng(3)
    base = rng.integers(0, 128, 200).tolist()
    firsts = [base[: 60 + 17 * i] + rng.integers(0, 128, 9).tolist() for i in range(8)]
    (tmp_path / "learn").mkdir()
    answers = [_answer(tmp_path / "learn", p)[:40] for p in firsts]
    stops = [[a[10 + 3 * i]] if a[10 + 3 * i] not in a[: 10 + 3 * i] else []
             for i, a in enumerate(answers)]
    sched, worker, runner = h.engine(tmp_path, YAML, retention=None, num_blocks=12,
                                     name="mixed.yaml", async_scheduling=True)
    try:
        outs = h.run_mixed(sched, runner, [h.make_request(f"a{i}", p, 40, stops[i])
                                           for i, p in enumerate(firsts)],
                           arrive_every=1, abort={"a5": 12}, pipelined=True)
        assert runner.preempted > 0  # deterministic here: the harness never races threads
        seconds = {i: firsts[i] + outs[f"a{i}"] + [5, 6, 7] for i in range(8) if i != 5}
        h.settle(sched, runner, seconds[7])
        idx = sched.connector.sched.index
        deep = [i for i, t in seconds.items() if idx.lookup(
            np.asarray(t), alignment=1, replay=False).num_tokens > len(firsts[i])]
        assert sched.reset_prefix_cache()
        h.run_mixed(sched, runner, [h.make_request(f"b{i}", t, 4) for i, t in seconds.items()],
                    arrive_every=1, pipelined=True)
        h.settle(sched, runner, seconds[7] + [1])
    finally:
        worker.shutdown()
    st = sched.connector.sched.stats
    assert runner.bad == [], runner.bad[:3]
    assert st.failed_loads == 0 and st.hits_without_state == 0 and st.hits >= 4
    idx.check_integrity()
    assert not sched.requests
    assert len(deep) >= 4, deep
