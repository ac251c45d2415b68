"""``AnswerReuse``: when next to no stored answer survives to its reuse, storage drops
from every 2nd answer to every ``rare``-th (admission/answers.py, ``LOST``/``RARE``)."""

from __future__ import annotations

from hybrid_connector.policies.admission.answers import AnswerReuse

LOST, RARE = 0.05, 32  # answers.py's defaults


def test_answers_all_lost_are_stored_rarely_and_a_survival_brings_storage_back() -> None:
    """Multi-round QA one request at a time at 0.25x the working set: none of 200 stored
    answers survived to the next round; each one written was lost room (and a hit that
    vLLM's own cache would have served)."""
    est = AnswerReuse(survival_horizon=2.0)
    for _ in range(5):
        est.survived(False)  # 1 -> 0.03: below LOST
    assert est.survival < LOST
    got = [est.decide() for _ in range(4 * RARE)]
    assert sum(got) == 4 and got.index(True) == RARE - 1
    est.survived(False)
    est.survived(True)  # back over 0.5: every answer
    assert [est.decide() for _ in range(3)] == [True] * 3


def test_a_few_survivals_keep_one_in_two() -> None:
    """Chat at 0.25x keeps ~11% surviving: still every 2nd answer."""
    est = AnswerReuse(survival_horizon=2.0)
    est.survived(False)
    est.survived(False)
    est.survived(False)  # 0.125
    assert est.survival >= LOST
    assert [est.decide() for _ in range(6)] == [False, True] * 3
