"""Marconi's candidate lists: moving one node's entry in its kind's two sorted lists.

An entry is ``(last_access, efficiency)`` for node ``nid``; it sits in the time list as
``(last_access, nid)`` and, for a ranked kind, in the efficiency list as
``(efficiency, nid)``. An access changes only the time, so only the time list is touched
(the lists end up holding exactly what a remove of the old entry and an add of the new one
leaves, so the order, ties by the smaller id included, is unchanged).
"""

from __future__ import annotations

from sortedcontainers import SortedList


def _swap(items: SortedList, have: float | None, want: float | None, nid: int) -> None:
    if have is not None:
        try:
            items.remove((have, nid))
        except ValueError:  # pragma: no cover - would be an index bug
            raise AssertionError(f"index lost node {nid}") from None
    if want is not None:
        items.add((want, nid))


def move_entry(by_time: SortedList, by_eff: SortedList | None,
               have: tuple[float, float] | None, want: tuple[float, float] | None,
               nid: int) -> None:
    """Replace node ``nid``'s entry ``have`` by ``want`` (None: absent) in ``by_time`` and
    ``by_eff`` (None: an unranked kind), touching only a list whose value changes."""
    if have is None or want is None:
        _swap(by_time, None if have is None else have[0], None if want is None else want[0],
              nid)
        if by_eff is not None:
            _swap(by_eff, None if have is None else have[1], None if want is None else want[1],
                  nid)
        return
    if have[0] != want[0]:
        _swap(by_time, have[0], want[0], nid)
    if by_eff is not None and have[1] != want[1]:
        _swap(by_eff, have[1], want[1], nid)
