"""``AnswerReuse``: the estimate of whether stored answers come back (admission/answers.py)."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid_connector.policies.admission.answers import AnswerReuse


def _toks(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, n).astype(np.int64)


def test_independent_requests_turn_storage_off_after_the_horizon() -> None:
    """No arrival extends an answer: the rate decays by (1 - 1/16) per arrival from 1 and
    falls below 0.1 at the 36th arrival, never before."""
    est = AnswerReuse()
    off_at = None
    for i in range(60):
        prompt = _toks(i, 100)
        est.arrived(prompt)
        if off_at is None and not est.stores:
            off_at = est.arrivals
        est.finished(np.concatenate([prompt, _toks(1000 + i, 10)]), 100)
    assert off_at == 36 and est.came_back == 0


def test_a_chat_keeps_storage_on_and_a_ghost_hit_turns_it_back_on() -> None:
    est = AnswerReuse(horizon=2.0)
    for i in range(6):  # off: six first turns
        est.arrived(_toks(i, 50))
        est.finished(np.concatenate([_toks(i, 50), _toks(100 + i, 8)]), 50)
    assert not est.stores
    # the next turn of the last session: extends an answer that was not stored
    nxt = np.concatenate([_toks(5, 50), _toks(105, 8), _toks(7, 3)])
    assert est.arrived(nxt) and est.stores and est.came_back == 1
    for _ in range(10):  # every turn extends the last: stays on
        est.finished(np.concatenate([nxt, _toks(9, 5)]), int(nxt.size))
        nxt = np.concatenate([nxt, _toks(9, 5), _toks(8, 2)])
        assert est.arrived(nxt) and est.stores


def test_only_a_whole_answer_extended_past_its_end_counts() -> None:
    """The same last 16 tokens at the same length after a different prefix (window key
    collision) is no match; an arrival that stops at the answer's end or inside it is
    none either (a hit must land below the request's length)."""
    est = AnswerReuse()
    prompt, ans = _toks(1, 40), _toks(2, 20)
    full = np.concatenate([prompt, ans])
    est.finished(full, 40)
    other = full.copy()
    other[:10] += 1
    assert not est.extends_answer(np.concatenate([other, [7]]))
    assert not est.extends_answer(full)
    assert not est.extends_answer(full[:50])
    assert est.extends_answer(np.concatenate([full, [7]]))
    est.finished(prompt, 40)  # no generated token: nothing recorded
    assert len(est) == 1


def test_memory_is_bounded_and_duplicates_are_counted() -> None:
    est = AnswerReuse(records=4)
    first = np.concatenate([_toks(0, 30), _toks(50, 5)])
    est.finished(first, 30)
    est.finished(first, 30)  # a duplicate: two references to one key
    for i in range(1, 3):
        est.finished(np.concatenate([_toks(i, 30), _toks(50 + i, 5)]), 30)
    assert len(est) == 4 and est.extends_answer(np.concatenate([first, [1]]))
    est.finished(np.concatenate([_toks(9, 30), _toks(59, 5)]), 30)  # drops one reference
    assert est.extends_answer(np.concatenate([first, [1]]))
    est.finished(np.concatenate([_toks(10, 30), _toks(60, 5)]), 30)  # drops the other
    assert not est.extends_answer(np.concatenate([first, [1]]))
    assert len(est) == 4


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        AnswerReuse(records=0)
    with pytest.raises(ValueError):
        AnswerReuse(horizon=0.5)


def test_answers_evicted_before_their_reuse_are_stored_one_in_two() -> None:
    """Answers come back but their states were gone (a tight budget): below 0.5 survival
    only every 2nd answer is stored; survivals bring storage back."""
    est = AnswerReuse(survival_horizon=2.0)
    assert [est.decide() for _ in range(3)] == [True] * 3
    est.survived(False)
    est.survived(False)  # 0.25
    assert [est.decide() for _ in range(6)] == [False, True] * 3
    est.survived(True)  # 0.625
    assert est.decide()
    est.rate = 0.05  # answers no longer come back: nothing stored, whatever survives
    assert not est.decide()


def test_the_stored_flag_is_recorded_per_answer() -> None:
    est = AnswerReuse()
    a = np.concatenate([_toks(1, 40), _toks(2, 8)])
    b = np.concatenate([_toks(3, 40), _toks(4, 8)])
    est.finished(a, 40, stored=False)
    est.finished(b, 40, stored=True)
    assert est.arrived(np.concatenate([a, [1]])) == (48, False)
    assert est.arrived(np.concatenate([b, [1]])) == (48, True)
    assert est.arrived(_toks(5, 60)) is None and est.came_back == 2
