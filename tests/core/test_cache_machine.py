"""Stateful property test of the cache against its stores: every plan is loaded and each
payload's provenance checked (KV made for exactly the query's prefix, the state made at
exactly p for that prefix, every size equal to the geometry's), over a ``MemoryStore`` and
a three-tier ``TieredStore`` (device, host, NVMe) with tight budgets, demotions, drops,
silent losses and on-disk corruption injected between steps."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from cache_support import (
    ALIGN,
    CHUNK,
    PAGE,
    SAVED,
    TINY,
    anchor_item,
    config,
    kv_items,
    made_for,
    state_item,
)
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hybrid_connector import assemble
from hybrid_connector.core.keys import ObjectKey, ObjectKind, PrefixHasher
from hybrid_connector.tiers.device import DeviceTier
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.manager import TieredStore
from hybrid_connector.tiers.memory import MemoryStore
from hybrid_connector.tiers.nvme import NvmeTier

KVB = TINY.kv_bytes_per_token()
SB = TINY.state_bytes()
AB = 16  # one anchor page of TINY at page 4, density 0.25

alphabet = st.lists(st.integers(0, 2), min_size=4, max_size=30)


def budgets(kv_chunks: int, states: int) -> dict[ObjectKind, int]:
    return {ObjectKind.KV: kv_chunks * CHUNK * KVB, ObjectKind.STATE: states * SB,
            ObjectKind.ANCHOR: 3 * AB}


class CacheMachine(RuleBasedStateMachine):
    """Random requests, lookups with loads, leases, and store faults."""

    @initialize(tiered=st.booleans(), kv=st.sampled_from([2, 4, 64]),
                states=st.sampled_from([1, 3, 64]), replay=st.booleans())
    def setup(self, tiered, kv, states, replay):
        self.dir = Path(tempfile.mkdtemp(prefix="hc-machine-"))
        if tiered:
            self.store = TieredStore([
                DeviceTier(budgets(kv, states), device="cpu"),
                HostTier(budgets(kv, states)),
                NvmeTier(self.dir, budgets(2 * kv, 2 * states), fsync=False),
            ], inline=True)  # deterministic steps (the driver and tier tests run async lanes)
        else:
            self.store = MemoryStore(budgets(kv, states))
        over = {"replay": True} if replay else {}
        self.c = assemble.cache(config(**over), TINY, self.store)
        self.leases = []
        self.seqs = []
        self.lost: set = set()      # indexed keys removed behind the cache's back

    def teardown(self):
        if hasattr(self, "c"):
            for lease in self.leases:
                self.c.release(lease)
            self.c.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ requests
    def _prompt(self, seq, data, reuse=None):
        if self.seqs and data.draw(st.booleans() if reuse is None else reuse):
            base = data.draw(st.sampled_from(self.seqs))
            seq = base[: data.draw(st.integers(1, len(base)))] + seq[: data.draw(st.integers(0, 4))]
        return np.asarray(seq, dtype=np.int64)

    @rule(seq=alphabet, data=st.data())
    def request(self, seq, data):
        """An engine-style request: lookup, save what prefill makes, finish."""
        toks = self._prompt(seq, data)
        self.seqs.append(list(toks))
        n = len(toks)
        plan = self.c.lookup(toks)
        sp = self.c.plan_saves(toks)
        p = plan.num_tokens
        states = [q for q in sp.state_positions if p < q < n]
        extra = data.draw(st.lists(st.integers(1, n).map(lambda x: x - x % ALIGN), max_size=2))
        states = sorted({*states, *(q for q in extra if p < q < n and q)})
        items = kv_items(toks, sp.kv_from, n, cuts=states) + [state_item(toks, q) for q in states]
        if self.c.config.replay:
            first = -(-p // PAGE) * PAGE
            items += [anchor_item(toks, s, s + PAGE) for s in range(first, n - PAGE + 1, PAGE)]
        self.c.save(toks, items)
        self._assert_healed(toks, items)
        if data.draw(st.booleans()):
            end = self.c.final_checkpoint(n)
            tail = kv_items(toks, n - n % CHUNK, n)
            self.c.finish(toks, tail + ([state_item(toks, end)] if end else []))

    @rule(seq=alphabet, hold=st.booleans(), data=st.data())
    def lookup_and_load(self, seq, hold, data):
        q = self._prompt(seq, data, st.sampled_from([True, True, True, False]))
        plan = self.c.lookup(q)
        p = plan.num_tokens
        assert p < len(q) and p % ALIGN == 0
        if not p:
            event("miss")
            return
        lease = self.c.acquire(plan)
        assert lease is not None
        res = self.c.load(plan)
        for obj in plan.objects:                      # every planned size is the geometry's
            assert obj.ref.nbytes == self.c.expected_nbytes(obj.ref.kind, obj.ref.start, obj.ref.end)
        if res.failed:
            event("load failed")
            assert res.num_tokens == 0 and res.state is None
            for ref in res.failed:                    # unindexed, or doomed until released
                assert ref.key not in self.c.index.where or ref.key in self.c.index.doomed
        else:
            event("exact hit" if plan.exact else "replay hit")
            assert res.num_tokens == p
            pos = 0
            for obj, t in zip(plan.kv, res.kv, strict=True):
                assert obj.ref.start == pos and t.numel() * t.element_size() == obj.ref.nbytes
                assert made_for(t, q, min(obj.ref.end, plan.kv_tokens))
                pos = obj.ref.end
            assert pos >= p and res.kv_tokens >= p
            if plan.exact:
                made = SAVED[res.state.numpy().tobytes()]
                assert made == tuple(int(t) for t in q[:p])   # made at exactly p, this prefix
            else:
                assert self.c.config.replay and plan.anchors[-1].ref.end == p
                for obj, t in zip(plan.anchors, res.anchors, strict=True):
                    assert made_for(t, q, obj.ref.end)
        if hold:
            self.leases.append(lease)
        else:
            self.c.release(lease)

    @rule()
    def release_all(self):
        for lease in self.leases:
            self.c.release(lease)
        self.leases = []

    def _assert_healed(self, toks, items):
        """After a save, none of its objects is indexed but absent from the store."""
        h = PrefixHasher(toks, self.c.config.hash_block_size)
        keys = [ObjectKey(self.c.fingerprint, h.at(i.end), i.kind, i.start, i.end) for i in items]
        keys = [k for k in keys if k in self.c.index.where and k not in self.c.index.doomed]
        assert all(w is not None for w in self.store.where(keys))

    # ------------------------------------------------------------------ faults
    def _indexed(self):
        return sorted(self.c.index.where, key=lambda k: (k.kind.value, k.start, k.end, k.prefix))

    @precondition(lambda self: hasattr(self, "c") and self.c.index.where)
    @rule(data=st.data(), what=st.sampled_from(["silent loss", "reported drop", "corrupt file"]))
    def fault(self, data, what):
        """The store loses an object and tells nobody (a restarted remote), drops one on
        its own and reports it, or a file of the NVMe tier rots."""
        event(what)
        if what == "corrupt file":
            files = sorted(p for p in self.dir.iterdir() if not p.name.startswith("."))
            if files:
                f = data.draw(st.sampled_from(files))
                raw = bytearray(f.read_bytes())
                raw[-1 - data.draw(st.integers(0, 8))] ^= 0x5A
                f.write_bytes(bytes(raw))
            return
        key = data.draw(st.sampled_from(self._indexed()))
        self.store.remove([key])
        if what == "silent loss":
            self.lost.add(key)
        else:
            self.store.report_dropped([key])

    # ------------------------------------------------------------------ invariants
    @invariant()
    def consistent(self):
        if not hasattr(self, "c"):
            return
        self.c.check_integrity()
        for k in ObjectKind:
            assert self.store.used(k) <= self.store.capacity(k)
            for t in getattr(self.store, "tiers", ()):
                assert t.used(k) <= t.capacity(k)
        held = {k for kind in ObjectKind for k in self.store.keys(kind)}
        assert held <= set(self.c.index.where)            # nothing stored that the index forgot
        indexed = sorted(self.c.index.where, key=str)
        absent = {k for k, w in zip(indexed, self.store.where(indexed), strict=True) if w is None}
        # the index lags the store only where a fault was injected (or a drop is deferred)
        assert absent <= self.lost | self.c.index.doomed
        self.lost = absent
        for k in ObjectKind:
            gone = sum(self.c.expected_nbytes(k, key.start, key.end) for key in absent
                       if key.kind is k)
            assert self.store.used(k) == self.c.tree.bytes[k] - gone


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=120, stateful_step_count=35, deadline=None)


def test_machine_payload_helpers_are_geometry_sized():
    toks = np.arange(12)
    assert anchor_item(toks, 0, PAGE).payload.numel() == AB
    assert state_item(toks, 8).payload.numel() == SB
    assert sum(i.payload.numel() for i in kv_items(toks, 0, 12)) == 12 * KVB
    assert torch.is_tensor(anchor_item(toks, 4, 8).payload)
