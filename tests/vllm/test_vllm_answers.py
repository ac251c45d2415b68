"""Stored answers through vLLM 0.33.0's own Scheduler: with ``save_decode_cache`` (what
``configs/vllm*.yaml`` ship) a request leaves its KV and its exact end-of-request state, and nothing more for
its generated tokens; the next turn hits at that end, byte-exact.

A state costs the host bytes of the KV of ~94 tokens at Qwen3.5's geometry, so the states
kept per request decide how many sessions a host budget holds (``checkpoints``): a boundary
of generated tokens is superseded by the exact tail less than a block later, and after a
stored answer the prompt's last boundary is a few tokens past the previous turn's tail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402
import vllm_support as s  # noqa: E402

YAML = s.BASE_YAML
PROMPT = 150


def _engine(root: Path, async_scheduling: bool = False) -> tuple[Any, Any, h.Runner]:
    # dense retention: vLLM offers the state at every block boundary it computes, the
    # generated tokens' boundaries included
    return h.engine(root, YAML + "save_decode_cache: true\n", retention=None, num_blocks=8,
                    name="answers.yaml", async_scheduling=async_scheduling)


def _states(sched: Any) -> int:
    return int(sched.connector.sched.stats.saved_objects.get("state", 0))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("out", [70, 43])
def test_an_answer_leaves_one_state_at_its_exact_end_and_the_next_turn_hits_there(
        tmp_path: Path, out: int, async_scheduling: bool) -> None:
    """Turn 1 (150 prompt tokens, ``out`` generated) ends at 150 + out - 1: 219 inside a
    block, or 192 on a boundary. vLLM offers the boundaries 160 and 192 of its generated
    tokens; only the prompt's last boundary (128: nothing stored before it) and the exact
    end are saved. Turn 2 (turn 1 + its answer + 3 tokens) hits at that end, and saves
    only its own end: its prompt's last boundary (192 or 160) lies below the hit.
    ``async``: vLLM's ``AsyncScheduler`` (its default on a GPU), two steps in flight: a
    decode step is planned before the token it computes is known, so the chunk that token
    ends is saved a step later (before, it was dropped and the hit stopped at 128)."""
    end = PROMPT + out - 1
    sched, worker, runner = _engine(tmp_path, async_scheduling)
    try:
        turn1 = np.random.default_rng(9).integers(0, 128, PROMPT).tolist()
        ans = h.run(sched, runner, [h.make_request("t1", turn1, out)],
                    pipelined=async_scheduling)["t1"]
        turn2 = turn1 + ans + [5, 6, 7]
        assert h.settle(sched, runner, turn2) == end
        assert _states(sched) == 2  # 128 and the end (was 4 with 160 and 192)
        computed = h.second_turn(sched, runner, turn2, pipelined=async_scheduling)
    finally:
        worker.shutdown()
    st = sched.connector.sched.stats
    assert runner.bad == [], runner.bad[:3]  # KV of [0, end) and the state at end, exact
    assert st.hits == 1 and st.failed_loads == 0
    assert st.hit_tokens == end
    assert computed == len(turn2) - end + 3
    assert _states(sched) == 3  # turn 2 added its exact end only
    assert not sched.requests  # the held blocks were released


def test_prompts_only_keeps_the_last_prompt_boundary(tmp_path: Path) -> None:
    """``save_decode_cache: false``: no KV or state of generated tokens; the next turn hits
    at the prompt's last boundary."""
    sched, worker, runner = h.engine(tmp_path, YAML + "save_decode_cache: false\n",
                                     retention=None, num_blocks=8, name="prompts.yaml")
    try:
        turn1 = np.random.default_rng(9).integers(0, 128, PROMPT).tolist()
        ans = h.run(sched, runner, [h.make_request("t1", turn1, 70)])["t1"]
        turn2 = turn1 + ans + [5, 6, 7]
        h.settle(sched, runner, turn2)
        assert _states(sched) == 1  # 128
        assert sched.reset_prefix_cache()
        h.run(sched, runner, [h.make_request("t2", turn2, 4)])
    finally:
        worker.shutdown()
    st = sched.connector.sched.stats
    assert runner.bad == [] and st.hits == 1 and st.hit_tokens == 128


def _gate(sched: Any) -> Any:
    """The scheduler side's answer gate, with a short horizon (a rate that halves per
    arrival that extends no answer: storage stops at the fourth such arrival)."""
    from hybrid_connector.integrations.vllm.checkpoints import AnswerGate
    from hybrid_connector.policies.admission.answers import AnswerReuse

    side = sched.connector.sched
    side.answers = AnswerGate(True, side.index, AnswerReuse(horizon=2.0))
    return side.answers


def _served(sched: Any, tokens: list[int]) -> int:
    idx = sched.connector.sched.index
    return int(idx.lookup(np.asarray(tokens), alignment=1, replay=False).num_tokens)


def test_answers_stop_being_stored_when_they_never_come_back(tmp_path: Path) -> None:
    """Independent requests (no prompt extends an earlier answer): the first three store
    their answers (the estimate starts at 1 and halves per arrival), the rest store their
    prompts only (the next turn would hit at the prompt's last boundary, 128, not at the
    end). A request that then extends such an unstored answer (remembered all the same)
    turns storage back on for itself."""
    sched, worker, runner = _engine(tmp_path)
    try:
        gate = _gate(sched)
        outs, served = [], []
        for i in range(5):
            prompt = np.random.default_rng(20 + i).integers(0, 128, PROMPT).tolist()
            ans = h.run(sched, runner, [h.make_request(f"r{i}", prompt, 10)])[f"r{i}"]
            outs.append(prompt + ans)
            served.append(h.settle(sched, runner, prompt + ans + [1]))
        assert served == [PROMPT + 9] * 3 + [128] * 2
        assert not gate.reuse.stores and gate.reuse.came_back == 0
        nxt = outs[-1] + [5, 6, 7]
        ans = h.run(sched, runner, [h.make_request("next", nxt, 10)])["next"]
        assert gate.reuse.came_back == 1 and gate.reuse.stores
        assert h.settle(sched, runner, nxt + ans + [1]) == len(nxt) + 9
    finally:
        worker.shutdown()
    assert runner.bad == []


def test_answers_stay_stored_while_each_turn_extends_the_last(tmp_path: Path) -> None:
    """A chat: every turn's prompt is the previous turn, its answer and a new message;
    every answer is stored, and each turn hits at the previous one's exact end."""
    sched, worker, runner = _engine(tmp_path)
    try:
        gate = _gate(sched)
        toks = np.random.default_rng(9).integers(0, 128, 40).tolist()
        for i in range(5):
            ans = h.run(sched, runner, [h.make_request(f"t{i}", toks, 6)])[f"t{i}"]
            toks = toks + ans + [5, 6, 7]
            assert h.settle(sched, runner, toks) == len(toks) - 4
        assert gate.reuse.came_back == 4 and gate.reuse.stores
    finally:
        worker.shutdown()
    assert runner.bad == []
