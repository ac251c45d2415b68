"""The arena allocator: never hands out overlapping extents, coalesces, rejects bad frees."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiers.slab import ALIGN, ArenaAllocator


def test_coalescing_restores_one_extent() -> None:
    a = ArenaAllocator(1024, 10 * ALIGN)
    offs = [a.alloc(ALIGN) for _ in range(10)]
    assert None not in offs and a.alloc(1) is None
    for o in offs[::2] + offs[1::2]:
        assert o is not None
        a.free(o, ALIGN)
    assert a.largest_free() == 10 * ALIGN and a.allocated == 0


def test_double_free_and_out_of_range() -> None:
    a = ArenaAllocator(0, 4 * ALIGN)
    o = a.alloc(10)
    assert o == 0
    a.free(o, 10)
    with pytest.raises(ValueError, match="double free"):
        a.free(o, 10)
    with pytest.raises(ValueError, match="outside"):
        a.free(8 * ALIGN, 10)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 700)), max_size=80))
def test_random_alloc_free_never_overlaps(ops: list[tuple[bool, int]]) -> None:
    a = ArenaAllocator(ALIGN, 64 * ALIGN)
    live: dict[int, int] = {}
    for is_alloc, n in ops:
        if is_alloc or not live:
            o = a.alloc(n)
            if o is None:
                assert a.largest_free() < max(n, 1)
                continue
            assert o % ALIGN == 0 and o >= ALIGN and o + n <= 65 * ALIGN
            for lo, ln in live.items():
                assert o + max(n, 1) <= lo or lo + max(ln, 1) <= o
            live[o] = n
        else:
            o = sorted(live)[n % len(live)]
            a.free(o, live.pop(o))
    for o, n in list(live.items()):
        a.free(o, n)
    assert a.largest_free() == 64 * ALIGN
