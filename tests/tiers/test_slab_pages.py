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


def test_a_put_waits_for_room_a_read_still_holds_instead_of_failing() -> None:
    """A removed object a concurrent read is copying out keeps its pages until the read
    unpins it, though the budget already counts them free. The executor's lane puts into
    that room (the ledger made it with the removal): the put failed, and an object taken
    out of its tier for a promotion was lost with it (a load under a lease then failed in
    ``tests/core/test_cache_threads.py``). The put now waits for the read to end."""
    import threading

    import torch

    from hybrid_connector.core.keys import ObjectKey, ObjectKind
    from hybrid_connector.tiers.host import HostTier

    def key(i: int) -> ObjectKey:
        return ObjectKey("fp", bytes([i]) * 16, ObjectKind.KV, 0, 8)

    t = HostTier({ObjectKind.KV: 2 * 4096}, name="h")
    read_ends = threading.Timer(0.3, t.unpin, ([key(1)],))
    try:
        a, b = torch.full((1024,), 1.0), torch.full((1024,), 2.0)  # 4 KiB each: full
        assert t.put([(key(1), a), (key(2), b)]) == [True, True]
        assert t.pin([key(1)]) == [True]  # a read of key 1 in progress
        assert t.remove([key(1)]) == [True]  # the removal the ledger made room with
        read_ends.start()
        assert t.put([(key(3), torch.full((1024,), 3.0))]) == [True]
        got = t.get([key(3)])[0]
        assert got is not None and bool((got == 3.0).all())
    finally:
        read_ends.join()
        t.close()
