"""Generators are deterministic, well formed and shaped as documented; JSONL round-trips."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybrid_connector.sim.traces import (
    GENERATORS,
    agentic,
    load_jsonl,
    multi_turn_chat,
    save_jsonl,
    shared_document_qa,
    system_prompts,
    validate,
)

SMALL = {"chat": (4, 3, 1), "agentic": (3, 6, 1), "docqa": (2, 10, 1), "sysprompt": (2, 10, 1),
         "oneshot": (12, 2, 1), "blog_agentic": (3, 4, 1), "blog_chat": (8, 4, 1),
         "chat_edits": (4, 5, 1), "agentic_branch": (3, 6, 1), "multiround_qa": (3, 3, 1), "mooncake": (20, 3, 1)}


@pytest.mark.parametrize("kind", sorted(GENERATORS))
def test_deterministic_sorted_and_valid(kind: str) -> None:
    gen = GENERATORS[kind]
    a = gen(*SMALL[kind])  # type: ignore[operator]
    b = gen(*SMALL[kind])  # type: ignore[operator]
    assert json.dumps(a) == json.dumps(b)
    assert [r["ts"] for r in a] == sorted(r["ts"] for r in a)
    for r in a:
        validate(r)
        assert isinstance(r["input_tokens"], list)
    c = gen(*SMALL[kind][:2], SMALL[kind][2] + 1)  # type: ignore[operator]
    assert json.dumps(a) != json.dumps(c)


def test_chat_turns_extend_the_history() -> None:
    recs = multi_turn_chat(2, 4, 0, lengths="sharegpt")
    by = {}
    for r in recs:
        by.setdefault(r["session_id"], []).append(r)
    for turns in by.values():
        turns.sort(key=lambda r: r["turn_id"])
        for prev, nxt in zip(turns, turns[1:], strict=False):
            hist = prev["input_tokens"] + prev["output_tokens"]
            assert nxt["input_tokens"][: len(hist)] == hist


def test_agentic_collapses_old_observations_and_branches() -> None:
    recs = agentic(1, 12, 3, retry_prob=0.0, keep_last=2, collapsed_tokens=4, as_arrays=True)
    recs = [r for r in recs if "aux" not in str(r["session_id"])]
    # Turn t+1 diverges from turn t's input+output inside the history (a collapse).
    a, b = recs[5], recs[6]
    full = np.concatenate([a["input_tokens"], a["output_tokens"]])
    n = min(full.size, b["input_tokens"].size)
    diverge = int(np.argmax(full[:n] != b["input_tokens"][:n]))
    assert 0 < diverge < a["input_tokens"].size
    side = agentic(2, 4, 0, side_calls=2.0)
    assert any("aux" in str(r["session_id"]) for r in side)


def test_docqa_and_sysprompts_share_prefixes() -> None:
    qa = shared_document_qa(1, 20, 0, full_doc_prob=0.0, section_tokens=256, as_arrays=True)

    def lcp(x: np.ndarray, y: np.ndarray) -> int:
        n = min(x.size, y.size)
        diff = np.flatnonzero(x[:n] != y[:n])
        return int(diff[0]) if diff.size else n

    depths = {lcp(qa[0]["input_tokens"], r["input_tokens"]) for r in qa[1:]}
    assert len(depths) > 1  # several overlap depths
    sp = system_prompts(1, 30, 0, variants_per_family=2, as_arrays=True)
    assert all(np.array_equal(sp[0]["input_tokens"][:500], r["input_tokens"][:500]) for r in sp)


def test_jsonl_roundtrip_and_errors(tmp_path) -> None:
    recs = agentic(2, 3, 0, as_arrays=True)
    path = tmp_path / "t.jsonl"
    assert save_jsonl(recs, path) == len(recs)
    back = load_jsonl(path)
    assert len(back) == len(recs)
    assert all(np.array_equal(x["input_tokens"], y["input_tokens"]) for x, y in zip(recs, back, strict=True))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"session_id": 1, "turn_id": 0, "ts": 0, "input_tokens": [1, 2]}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: missing field\(s\) output_tokens"):
        load_jsonl(bad)
    bad.write_text('{"session_id": 1, "turn_id": 0, "ts": 0, "input_tokens": [1, -2], "output_tokens": []}\n')
    with pytest.raises(ValueError, match="input_tokens"):
        load_jsonl(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match="not JSON"):
        load_jsonl(bad)


def _prefix_uses(recs, min_len: int) -> dict[bytes, int]:
    """How many requests start with each distinct leading ``min_len`` tokens."""
    out: dict[bytes, int] = {}
    for r in recs:
        k = np.asarray(r["input_tokens"][:min_len]).tobytes()
        out[k] = out.get(k, 0) + 1
    return out


def test_blog_traces_have_the_posts_shapes() -> None:
    from hybrid_connector.sim.traces_blog import blog_agentic, blog_chat

    a = blog_agentic(as_arrays=True)
    longs = [r for r in a if len(r["input_tokens"]) >= 4096]
    uses = _prefix_uses(longs, 4096)
    assert len(uses) == 15 and 15 <= np.mean(list(uses.values())) <= 25  # ~20 reuses each
    hot = _prefix_uses([r for r in a if len(r["input_tokens"]) < 2048], 256)
    assert 20 <= len(hot) <= 40 and max(hot.values()) > 20  # Zipf-hot short prefixes
    b = blog_chat(as_arrays=True)
    uses = _prefix_uses([r for r in b if len(r["input_tokens"]) >= 4096], 4096)
    assert len(uses) == 500 and set(uses.values()) == {1, 2}
    assert len(b) == pytest.approx(1500, rel=0.05)
