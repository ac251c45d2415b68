"""The page pool: never hands out overlapping pages, always has room for what fits in whole
pages (no external fragmentation), rejects bad frees."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_connector.tiers.slab import ALIGN, PAGES_PER_POOL, PagePool, page_bytes


def test_pages_are_reused_in_any_order() -> None:
    a = PagePool(1024, 10, ALIGN)
    runs = [a.alloc(ALIGN) for _ in range(10)]
    assert None not in runs and a.alloc(1) is None
    for r in runs[::2] + runs[1::2]:
        assert r is not None
        a.free(r)
    assert a.free_pages == 10
    assert a.alloc(10 * ALIGN) == ((1024, 10 * ALIGN),)  # all free again: one run


def test_double_free_and_out_of_range() -> None:
    a = PagePool(0, 4, ALIGN)
    r = a.alloc(10)
    assert r == ((0, 10),)
    a.free(r)
    with pytest.raises(ValueError, match="double free"):
        a.free(r)
    with pytest.raises(ValueError, match="outside"):
        a.free(((8 * ALIGN, 10),))


def test_page_size_tracks_the_budget() -> None:
    assert page_bytes(100) == ALIGN and page_bytes(4096 * 1000) % ALIGN == 0
    assert 4096 * 1000 // page_bytes(4096 * 1000) <= PAGES_PER_POOL


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 700)), max_size=80))
def test_random_alloc_free_never_overlaps_and_never_fragments(ops: list[tuple[bool, int]]) -> None:
    a = PagePool(ALIGN, 64, ALIGN)
    live: list[tuple[tuple[int, int], ...]] = []
    for is_alloc, n in ops:
        if is_alloc or not live:
            need = -(-max(n, 1) // ALIGN)
            r = a.alloc(n)
            if r is None:
                assert a.free_pages < need           # only a real shortage refuses
                continue
            assert sum(ln for _, ln in r) == max(n, 1)
            for off, ln in r:
                assert off % ALIGN == 0 and off >= ALIGN and off + ln <= 65 * ALIGN
                for other in live:
                    for o2, l2 in other:
                        assert off + ln <= o2 or o2 + l2 <= off
            live.append(r)
        else:
            a.free(live.pop(n % len(live)))
    for r in live:
        a.free(r)
    assert a.free_pages == 64
