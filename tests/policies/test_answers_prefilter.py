"""``AnswerReuse.extends_answer`` probes only the recorded lengths whose last token the
query repeats (a ring of the records' length and last token): it must answer exactly what
a probe of every recorded answer answers, through the FIFO's drops and duplicates. And two
answers of one length and one last window are two answers (they shared one key, digest
and all, before)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_connector.policies.admission.answers import AnswerReuse, _digest


def _every_probe(est: AnswerReuse, query: np.ndarray) -> tuple[int, bool] | None:
    """The answer without the prefilter: a probe of every recorded length, longest first."""
    raw = query.astype(np.int64).tobytes()
    for n in sorted((n for n in est._keys if n < query.size), reverse=True):
        by = est._keys[n].get(raw[8 * max(0, n - est.window):8 * n])
        got = by.get(_digest(query[:n])) if by is not None else None
        if got is not None:
            return n, got[1]
    return None


def _longest(live: list[np.ndarray], query: np.ndarray) -> int | None:
    """The longest live record ``query`` runs past the end of (by brute force)."""
    ns = [t.size for t in live if t.size < query.size and np.array_equal(query[:t.size], t)]
    return max(ns, default=None)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_prefilter_answers_what_every_probe_answers(data: st.DataObject) -> None:
    cap = data.draw(st.integers(1, 6))
    est = AnswerReuse(records=cap, window=data.draw(st.integers(1, 5)))
    pool = [np.array(data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=12)),
                     dtype=np.int64) for _ in range(4)]
    live: list[np.ndarray] = []
    for _ in range(data.draw(st.integers(0, 14))):
        base = pool[data.draw(st.integers(0, 3))]
        toks = base[: data.draw(st.integers(1, base.size))]
        stored = data.draw(st.booleans())
        est.record(toks, stored)
        live = (live + [toks])[-cap:]
        query = np.concatenate([pool[data.draw(st.integers(0, 3))],
                                np.array(data.draw(st.lists(st.integers(0, 3), max_size=3)),
                                         dtype=np.int64)])
        got = est.extends_answer(query)
        assert got == _every_probe(est, query)
        assert (got[0] if got else None) == _longest(live, query)


def test_answers_sharing_length_and_window_are_told_apart() -> None:
    """Keyed by (length, window) alone, the second answer took the first one's digest: a
    request extending the second was not counted, and one extending the first still was
    after the first left the FIFO."""
    est = AnswerReuse(records=1, window=2)
    first = np.array([1, 2, 3, 7, 7], dtype=np.int64)
    second = np.array([4, 5, 6, 7, 7], dtype=np.int64)
    est.record(first)
    est.record(second, stored=False)  # the FIFO holds one: the first is dropped
    assert est.extends_answer(np.append(second, 9)) == (5, False)
    assert est.extends_answer(np.append(first, 9)) is None
    est.record(first)
    assert est.extends_answer(np.append(first, 9)) == (5, True)
    assert est.extends_answer(np.append(second, 9)) is None
