"""Exact prompt ends through vLLM 0.33.0's own Scheduler (``checkpoints.PromptGate``).

A request whose answer is not stored and that finishes at its prompt's end (one generated
token) leaves the state at that exact end and the KV past the prompt's last block boundary;
only a later prompt that extends that exact prompt can hit there. Independent requests
(a Mooncake-style trace) never do: after a few arrivals the save stops at the last
boundary. A chat (each turn resends the previous prompt, its answer and a new message)
keeps saving exactly, every turn hitting at the previous prompt's end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402
import vllm_support as s  # noqa: E402

YAML = s.BASE_YAML + 'save_decode_cache: false\n'
PROMPT = 150  # ends inside a block: its last boundary is 128


def _engine(root: Path) -> tuple[Any, Any, h.Runner]:
    sched, worker, runner = h.engine(root, YAML, retention=None, num_blocks=8,
                                     name="prompt_gate.yaml")
    return sched, worker, runner


def _gate(sched: Any) -> Any:
    """The scheduler side's prompt gate with a short horizon (the rate halves per arrival
    that extends no recorded prompt: exact saves stop at the fourth such arrival)."""
    from hybrid_connector.integrations.vllm.checkpoints import PromptGate
    from hybrid_connector.policies.admission.answers import AnswerReuse

    side = sched.connector.sched
    side.prompts = PromptGate(side.bs, AnswerReuse(horizon=2.0))
    return side.prompts


def test_prompt_ends_stop_being_saved_when_no_prompt_extends_them(tmp_path: Path) -> None:
    """Five independent prefill-only requests: the first three save their exact prompt end
    (the estimate starts at 1 and halves per arrival), the last two stop at 128 (no state
    at 150, no KV of [128, 150))."""
    sched, worker, runner = _engine(tmp_path)
    try:
        gate = _gate(sched)
        served = []
        for i in range(5):
            prompt = np.random.default_rng(30 + i).integers(0, 128, PROMPT).tolist()
            h.run(sched, runner, [h.make_request(f"r{i}", prompt, 1)])
            served.append(h.settle(sched, runner, prompt + [1]))
        assert served == [PROMPT] * 3 + [128] * 2
        assert not gate.reuse.stores and gate.reuse.came_back == 0
        assert len(gate.reuse) == 5  # every prompt recorded, saved or not
    finally:
        worker.shutdown()
    assert runner.bad == []


def test_prompt_ends_stay_saved_while_each_turn_extends_the_last(tmp_path: Path) -> None:
    """A chat of prefill-only turns: every prompt end is saved, and each turn hits at the
    previous turn's exact prompt end (byte-exact), far past its last boundary."""
    sched, worker, runner = _engine(tmp_path)
    try:
        gate = _gate(sched)
        toks = np.random.default_rng(9).integers(0, 128, 40).tolist()
        hits = []
        for i in range(5):
            before = sched.connector.sched.stats.hit_tokens
            ans = h.run(sched, runner, [h.make_request(f"t{i}", toks, 1)],
                        evict_every=0)[f"t{i}"]
            hits.append(sched.connector.sched.stats.hit_tokens - before)
            assert h.settle(sched, runner, toks + [1]) == len(toks)
            assert sched.reset_prefix_cache()  # hits must come from the connector
            toks = toks + ans + [5, 6, 7] * 3
        assert gate.reuse.came_back == 4 and gate.reuse.stores
        assert hits[1:] == [40 + 10 * i for i in range(4)]  # each previous prompt's end
    finally:
        worker.shutdown()
    assert runner.bad == []
