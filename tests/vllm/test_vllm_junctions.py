"""Junctions from the whole index through vLLM 0.33.0's own Scheduler: a request that leaves
a stored path at J, past the deepest state stored on it and inside one prefill chunk, has
vLLM end its chunk at J (``request.shared_prefix_boundary``, set by the connector's hit
query), so the state at J is offered and saved, and a third request sharing those tokens
hits at J instead of the shallower state. The device cache is emptied before each request,
so only the index knows the branch; the harness byte-checks every restored KV and state."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402
import vllm_support as s  # noqa: E402

from hybrid_connector.integrations.vllm import junctions  # noqa: E402
from hybrid_connector.integrations.vllm import scheduler as sched_side  # noqa: E402

YAML = """chunk_size: 64
hash_block_size: 32
alignment: 32
pools:
  host: {kv: 8MB, state: 4MB}
replay: false
admission: marconi
"""
PROMPT, SPLIT = 400, 300  # B and C share A's first 300 tokens; vLLM's chunks hold 256
J = SPLIT - SPLIT % s.BLOCK  # 288: the junction, block-floored


def _serve(tmp_path: Path, retention: int | None) -> tuple[list[int], h.Runner]:
    """A, then B (leaves A's path at 300), then C (leaves B's at 300), each after the
    device cache was emptied; returns the external hit tokens of B and C and the runner."""
    sched, worker, runner = h.engine(tmp_path, YAML, retention=retention, num_blocks=64,
                                     name="junctions.yaml")
    st = sched.connector.sched.stats
    rng = np.random.default_rng(27)
    a = rng.integers(0, 128, PROMPT).tolist()
    b = a[:SPLIT] + [(t + 1) % 128 for t in a[SPLIT:]]
    c = a[:SPLIT] + [(t + 2) % 128 for t in a[SPLIT:]]
    hits = []
    for name, prompt in (("a", a), ("b", b), ("c", c)):
        before = st.hit_tokens
        h.run(sched, runner, [h.make_request(name, prompt, 2)])
        h.settle(sched, runner, prompt)
        assert sched.reset_prefix_cache()  # the device cache forgets the request
        hits.append(st.hit_tokens - before)
    worker.shutdown()
    assert st.failed_loads == 0 and st.hits_without_state == 0
    return hits[1:], runner


@pytest.mark.parametrize("retention", [None, 0])
def test_a_sibling_hits_at_the_branch_point_the_index_knows(
        tmp_path: Path, retention: int | None) -> None:
    """retention None (dense, the head-to-head's): A's chunk end at 256 is stored, B hits
    there; 0 (vLLM's default): only A's prompt boundary (384) is stored, B misses."""
    (b_hit, c_hit), runner = _serve(tmp_path, retention)
    assert runner.bad == [], runner.bad[:3]  # every restored KV and state byte exact
    assert b_hit == (256 if retention is None else 0)
    assert c_hit == J  # the state at the junction B's chunk ended on


@pytest.mark.parametrize("retention", [None, 0])
def test_without_the_junction_the_sibling_hits_lower(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, retention: int | None) -> None:
    """Negative control: the hook disabled, B's chunk runs past 288, no state is offered
    there and C hits only where B did."""
    monkeypatch.setattr(sched_side, "offer_junction", lambda *a, **k: 0)
    (b_hit, c_hit), runner = _serve(tmp_path, retention)
    assert runner.bad == [], runner.bad[:3]
    assert c_hit == b_hit < J


@pytest.mark.parametrize("matched, hit, engine, want", [
    (300, 256, 0, 288),   # floored to the block
    (300, 288, 0, 0),     # not past the hit
    (300, 0, 288, 0),     # vLLM's own junction is as deep
    (300, 0, 64, 0),      # vLLM's own, past the hit, is never displaced
    (300, 96, 64, 288),   # vLLM's own lies below the hit: stale
    (399, 0, 0, 384),     # leaves the stored path inside the prompt
    (400, 0, 0, 0),       # the prompt is a prefix of a stored path: no branch in it
    (0, 0, 0, 0),         # nothing stored
])
def test_junction_rule(matched: int, hit: int, engine: int, want: int) -> None:
    assert junctions.junction(matched, hit=hit, engine_junction=engine, prompt_len=400,
                              block=32) == want


def _index(length: int, partial: bool, children: int) -> Any:
    m = SimpleNamespace(length=length, partial=object() if partial else None,
                        node=SimpleNamespace(children=dict.fromkeys(range(children))))
    return SimpleNamespace(lock=threading.RLock(), tree=SimpleNamespace(match=lambda t: m))


def _plan(matched: int, hit: int = 0) -> Any:
    return SimpleNamespace(matched_tokens=matched, num_tokens=hit)


def test_offer_junction_keeps_vllms_own() -> None:
    r = SimpleNamespace(num_prompt_tokens=400, shared_prefix_boundary=192)
    toks = np.arange(400)
    assert junctions.offer_junction(_index(150, True, 0), r, toks, _plan(150), 0, 32) == 0
    assert r.shared_prefix_boundary == 192
    r.shared_prefix_boundary = 64  # below the hit (96)
    assert junctions.offer_junction(_index(150, True, 0), r, toks, _plan(150, 96), 0, 32) == 128
    assert r.shared_prefix_boundary == 128


@pytest.mark.parametrize("partial, children, want", [
    (True, 0, 128),   # leaves a stored path inside an edge: a branch
    (False, 2, 128),  # at a node other paths go on from: a branch
    (False, 0, 0),    # extends a leaf: a continuation past where the saves stop
])
def test_only_a_branch_is_a_junction(partial: bool, children: int, want: int) -> None:
    r = SimpleNamespace(num_prompt_tokens=400, shared_prefix_boundary=0)
    idx = _index(150, partial, children)
    assert junctions.offer_junction(idx, r, np.arange(400), _plan(150, 64), 32, 32) == want
    assert r.shared_prefix_boundary == want
