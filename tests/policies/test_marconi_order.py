"""``marconi_order.move_entry`` leaves the candidate lists as remove-then-add would."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from hybrid_connector.policies.eviction.marconi_order import move_entry

_VAL = st.sampled_from([0.0, 1.0, 2.0, 2.5, 7.0])  # few values: many ties and no-ops
_ENTRY = st.none() | st.tuples(_VAL, _VAL)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), _ENTRY), max_size=60), st.booleans())
def test_move_entry_orders_like_remove_then_add(steps: list, ranked: bool) -> None:
    by_time, by_eff = SortedList(), SortedList() if ranked else None
    ref_time, ref_eff = SortedList(), SortedList()
    keys: dict[int, tuple[float, float]] = {}
    for nid, want in steps:
        have = keys.get(nid)
        if want == have:
            continue
        move_entry(by_time, by_eff, have, want, nid)
        if have is not None:  # the reference: drop the old entry from both lists, add anew
            ref_time.remove((have[0], nid))
            ref_eff.remove((have[1], nid))
        if want is not None:
            ref_time.add((want[0], nid))
            ref_eff.add((want[1], nid))
            keys[nid] = want
        else:
            keys.pop(nid, None)
        assert list(by_time) == list(ref_time)
        if by_eff is not None:
            assert list(by_eff) == list(ref_eff)
