"""Slab pages are powers of two: a pool holds as many power-of-two objects (KV chunks) as
its budget has room for, with no page waste (a page of budget / PAGES_PER_POOL rounded
only to ALIGN charged a 16 KiB chunk 17.5 KiB at 8.99 MB)."""

from __future__ import annotations

import pytest

from hybrid_connector.tiers.slab import ALIGN, PAGES_PER_POOL, PagePool, page_bytes


@pytest.mark.parametrize("budget", [8_987_392, 4_493_696, 2_246_848, 17_974_784, 1_000_003])
def test_power_of_two_chunks_fill_the_budget(budget: int) -> None:
    page = page_bytes(budget)
    assert page >= ALIGN and page & (page - 1) == 0
    assert budget // page <= PAGES_PER_POOL
    chunk = 16_384  # 64 tokens x 256 B (the head-to-head's KV chunk)
    pool = PagePool(0, budget // page, page)
    held = 0
    while pool.alloc(chunk) is not None:
        held += 1
    assert held == budget // chunk
