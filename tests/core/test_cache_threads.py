"""Concurrent use of one cache: saves of overlapping requests, loads and evictions from
several threads, over a ``MemoryStore`` and multi-tier ``TieredStore``s with tight budgets.

A request saved while another thread's put of the same object is still in flight must skip
that object as present, never place it again (it raised ``KeyError ... is already placed``
from the ledger). An anchor page a lease holds is never evicted, even after another save's
split moved it off the node the lease locked (its load failed). After the threads are
joined and the lanes flushed, the index, the ledger and the tiers must agree, and every
loaded payload must have been made for the query's prefix.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from cache_support import (
    ALIGN,
    CHUNK,
    PAGE,
    TINY,
    anchor_item,
    config,
    kv_items,
    made_for,
    state_item,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from hybrid_connector import assemble
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.runtime.cache import HybridCache
from hybrid_connector.tiers.device import DeviceTier
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.manager import TieredStore
from hybrid_connector.tiers.memory import MemoryStore

KVB = TINY.kv_bytes_per_token()
SB = TINY.state_bytes()
AB = 16  # one anchor page of TINY at page 4, density 0.25
THREADS = 8
JOIN_S = 120.0  # generous: a busy 2-core machine


def budgets(kv_chunks: int, states: int, anchors: int = 4) -> dict[ObjectKind, int]:
    return {ObjectKind.KV: kv_chunks * CHUNK * KVB, ObjectKind.STATE: states * SB,
            ObjectKind.ANCHOR: anchors * AB}


class GatedHost(HostTier):
    """A host tier whose puts wait for ``gate`` (a slow tier: puts stay in flight)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()

    def put(self, items: Any, metas: Any = None) -> list[bool]:
        assert self.gate.wait(JOIN_S), "gate never opened"
        return super().put(items, metas)


def items_for(toks: np.ndarray) -> list:
    n = len(toks)
    return (kv_items(toks, 0, n) + [state_item(toks, p) for p in range(ALIGN, n + 1, ALIGN)]
            + [anchor_item(toks, s, s + PAGE) for s in range(0, n - PAGE + 1, PAGE)])


def check_consistent(c: HybridCache) -> None:
    """The index's and the ledger's invariants, and the tiers hold what the ledger says."""
    c.check_integrity()
    store = c.store
    assert isinstance(store, TieredStore)
    with store.lock:
        entries = dict(store.ledger.entries)
    for key, e in entries.items():
        assert e.tier is None or store.executor.tiers[e.tier].contains([key])[0], (
            f"{key}: the ledger says {e.tier}, that tier does not hold it")
    for t in store.tiers:
        for key in t.held_keys():
            assert key in entries and entries[key].tier == t.name, f"{key}: stray in {t.name}"


# ------------------------------------------------------------------ item 10, deterministic
def test_save_of_an_object_whose_put_is_in_flight_skips_it() -> None:
    """Hardening item 10: the second save of a request whose first save's puts are still
    in flight skips every object as present (it raised KeyError for the checkpoints and
    anchors); both saves complete and the objects load."""
    slow = GatedHost(budgets(64, 64, 64), name="h0")
    store = TieredStore([slow, HostTier(budgets(64, 64, 64), name="h1")])
    c = assemble.cache(config(replay=True), TINY, store)
    try:
        toks = np.array([1, 2, 1, 0, 2, 2, 1, 0, 1, 1, 2, 0, 0, 1, 2, 1])
        items = items_for(toks)
        first = c.save_async(toks, items)
        second = c.save_async(toks, items_for(toks))
        slow.gate.set()
        r1, r2 = first.result(JOIN_S), second.result(JOIN_S)
        assert (r1.stored, r1.rejected) == (len(items), 0)
        assert (r2.stored, r2.present, r2.rejected) == (0, len(items), 0)
        c.flush()
        check_consistent(c)
        plan = c.lookup(np.append(toks, 0))  # a hit leaves the last token to compute
        assert plan.num_tokens == len(toks)
        lease = c.acquire(plan)
        try:
            got = c.load(plan)
        finally:
            c.release(lease)
        assert not got.failed and got.state is not None and made_for(got.state, toks, len(toks))
    finally:
        slow.gate.set()
        c.close()


# ------------------------------------------------------------------ leased anchors, deterministic
def _anchor_stores() -> dict[str, TieredStore]:
    # four anchor pages in all (a tier's 64 B grain charges a page 64 B), so one more
    # page evicts; room for everything else
    return {"memory": MemoryStore(budgets(64, 64)),
            "three_tiers": TieredStore([DeviceTier(budgets(64, 64), device="cpu"),
                                        HostTier(budgets(64, 64)),
                                        HostTier(budgets(64, 64, 8), name="host2")])}


@pytest.mark.parametrize("store", ["memory", "three_tiers"])
def test_a_leased_anchor_moved_by_a_split_is_not_evicted(store: str) -> None:
    """What two threads of the property below did: one acquired a replay plan whose anchor
    page sat on a long edge, another saved a branch off that edge (the split moved the page
    to a new node, without the node-local anchor lock) and needed anchor room; the page was
    evicted under the lease and the load failed. A leased page is never a victim."""
    c = assemble.cache(config(replay=True), TINY, _anchor_stores()[store])
    try:
        toks = np.array([1, 2, 1, 0, 2, 2, 1, 0, 1, 1, 2, 0, 0, 1, 2, 1])
        pages = [anchor_item(toks, s, s + PAGE) for s in range(0, len(toks), PAGE)]
        assert c.save(toks, kv_items(toks, 0, len(toks)) + pages).stored == 2 + len(pages)
        query = np.append(toks[:12], 3)  # diverges inside the one edge [0, 16)
        plan = c.lookup(query)
        assert (plan.num_tokens, plan.exact) == (12, False)
        assert [(o.ref.start, o.ref.end) for o in plan.anchors] == [(8, 12)]
        lease = c.acquire(plan)
        assert lease is not None
        try:
            branch = np.append(toks[:12], [3, 3, 3, 3])  # splits the edge at 12
            r = c.save(branch, [anchor_item(branch, 12, 16)])
            c.flush()
            got = c.load(plan)
        finally:
            c.release(lease)
        assert not got.failed, f"load failed: {got.failed}"
        assert made_for(got.anchors[0], query, 12)
        # the held page shares its node with the only other victims: no room while leased
        assert [x.reason for x in r.rejections] == ["no_room"]
        again = c.save(branch, [anchor_item(branch, 12, 16)])  # released: evictable again
        assert (again.stored, again.rejected) == (1, 0)
        c.flush()
        check_consistent(c)
    finally:
        c.close()


# ------------------------------------------------------------------ threaded property
def memory() -> TieredStore:
    return MemoryStore(budgets(6, 4))


def two_hosts() -> TieredStore:
    return TieredStore([HostTier(budgets(3, 2), name="h0"), HostTier(budgets(6, 4), name="h1")])


def three_tiers() -> TieredStore:
    return TieredStore([DeviceTier(budgets(2, 1), device="cpu"), HostTier(budgets(3, 2)),
                        HostTier(budgets(6, 4), name="host2")])


STORES = {"memory": memory, "two_hosts": two_hosts, "three_tiers": three_tiers}
# Requests over a small alphabet from a few shared stems, so threads save overlapping
# prefixes (the same checkpoints) at the same time.
stems = st.lists(st.integers(0, 1), min_size=4, max_size=8)
request = st.tuples(st.integers(0, 2), st.lists(st.integers(0, 2), min_size=0, max_size=16),
                    st.sampled_from(["save", "load", "finish"]))
OPS = 24  # per thread: a fixed amount of work, not a time window


def run_thread(c: HybridCache, stems_: list[list[int]], ops: list, errors: list) -> None:
    try:
        for stem, tail, what in ops:
            toks = np.array(stems_[stem] + tail)
            if what == "load":
                plan = c.lookup(toks)
                lease = c.acquire(plan)
                if lease is None:
                    continue
                try:
                    got = c.load(plan)
                finally:
                    c.release(lease)
                assert not got.failed, f"load failed: {got.failed}"
                if got.state is not None:
                    assert made_for(got.state, toks, plan.num_tokens), "state of another prefix"
                for t, o in zip(got.kv, plan.kv, strict=False):
                    assert made_for(t, toks, min(o.ref.end, plan.kv_tokens)), "KV of another prefix"
                for t, o in zip(got.anchors, plan.anchors, strict=False):
                    assert made_for(t, toks, o.ref.end), "anchor of another prefix"
            elif what == "finish":
                c.finish(toks, items_for(toks)[-1:])
            else:
                c.save(toks, items_for(toks))
    except BaseException as exc:  # reported by the main thread
        errors.append(exc)


@pytest.mark.parametrize("store", sorted(STORES))
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(stems_=st.lists(stems, min_size=3, max_size=3),
       work=st.lists(st.lists(request, min_size=OPS, max_size=OPS),
                     min_size=THREADS, max_size=THREADS))
def test_threads_save_load_evict_keep_integrity(store: str, stems_: list[list[int]],
                                                work: list[list[Any]]) -> None:
    """Hardening item 10: 8 threads save, load and finish overlapping requests into tight
    budgets (evicting, demoting, dropping); no call raises, every loaded payload was made
    for its query's prefix, and the index, the ledger and the tiers agree after."""
    c = assemble.cache(config(replay=True), TINY, STORES[store]())
    errors: list[BaseException] = []
    threads = [threading.Thread(target=run_thread, args=(c, stems_, ops, errors))
               for ops in work]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_S)
        assert not any(t.is_alive() for t in threads), "a thread is stuck"
        if errors:
            raise errors[0]
        c.flush()
        check_consistent(c)
    finally:
        for t in threads:
            t.join(JOIN_S)
        c.close()
