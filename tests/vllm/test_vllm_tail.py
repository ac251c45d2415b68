"""Exact end-of-request states (Marconi's input+output checkpoint) through vLLM 0.33.0's own
Scheduler: a request that ends inside a block leaves its state at its exact last computed
token, and a continuation sharing that prefix hits there, not at the block below. vLLM
accepts an external hit of any length for a hybrid model (``Scheduler.schedule`` floors it
to a block only under DSV4.1's bounded replay), and its worker reads the state of a hit of N
tokens from the Mamba block ``(N - 1) // block_size``; the harness byte-checks the KV of
``[0, N)`` and that state against the "model" that produced the saved bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402
import vllm_support as s  # noqa: E402

YAML = s.BASE_YAML + 'save_decode_cache: true\n'
PROMPT, OUT = 150, 70
END = PROMPT + OUT - 1  # the last sampled token is never computed: 219, inside block 6


def _engine(root: Path, retention: int | None) -> tuple[Any, Any, h.Runner]:
    return h.engine(root, YAML, retention=retention, num_blocks=7, name="tail.yaml")


def _turns(sched: Any, worker: Any, runner: h.Runner) -> tuple[list[int], int]:
    turn1 = np.random.default_rng(9).integers(0, 128, PROMPT).tolist()
    out = h.run(sched, runner, [h.make_request("t1", turn1, OUT)])["t1"]
    turn2 = turn1 + out + [5, 6, 7]
    assert h.settle(sched, runner, turn2) == END  # and vLLM freed t1's blocks
    assert sched.reset_prefix_cache()  # the device cache forgot the first turn
    before = runner.computed_tokens
    h.run(sched, runner, [h.make_request("t2", turn2, 4)])
    worker.shutdown()
    return turn2, runner.computed_tokens - before


def test_a_continuation_hits_at_the_exact_end_of_the_previous_request(tmp_path: Path) -> None:
    assert END % s.BLOCK, "the first request must end inside a block"
    sched, worker, runner = _engine(tmp_path, retention=0)
    turn2, computed = _turns(sched, worker, runner)
    st = sched.connector.sched.stats
    assert runner.bad == [], runner.bad[:3]  # KV of [0, 219) and the state at 219, byte-exact
    assert st.hits == 1 and st.failed_loads == 0
    assert st.hit_tokens == END  # not 192 (the block below) nor 128 (the prompt's boundary)
    assert computed == len(turn2) - END + 3  # only the new tokens were computed
    assert not sched.requests  # the held blocks were released


@pytest.mark.parametrize("wrong", [False, True])
def test_vllms_partial_tail_source_is_copied_and_a_wrong_one_is_caught(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wrong: bool) -> None:
    """``register_finished_partial_tail`` names the exact blocks of the tail state (vLLM
    calls it when its own cache keyed a partial tail at the request's end). Here vLLM's
    finalizer is made to name them: the right block, or (negative control) the block below,
    which holds the state at 192, retained by ``retention=None``; the harness must catch
    a hit at 219 restored from it."""
    sched, worker, runner = _engine(tmp_path, retention=None)
    sc = sched.connector.sched
    kcm = sched.kv_cache_manager
    real_finalize = kcm.finalize_partial_tail_offloads

    def finalize(request: Any) -> list[tuple[int, int, int]]:
        assert real_finalize(request) == []  # vLLM keys no tail with hash block == block
        n = request.num_computed_tokens
        if wrong:
            below = n - n % s.BLOCK
            return [(g, b, n) for g, b in sc.offers_of(request.request_id)[below].items()]
        ids = kcm.get_block_ids(request.request_id)
        return [(g, ids[g][(n - 1) // s.BLOCK], n) for g in sc.groups.recurrent_groups]

    monkeypatch.setattr(kcm, "finalize_partial_tail_offloads", finalize)
    _turns(sched, worker, runner)
    assert sc.stats.hit_tokens == END
    if wrong:
        assert runner.bad and "state at 219" in runner.bad[0], runner.bad[:3]
    else:
        assert runner.bad == [], runner.bad[:3]
