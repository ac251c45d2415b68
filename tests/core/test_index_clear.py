"""``CacheIndex.clear``: forget everything of a model (an engine's reset after its weights
changed). Every object is unindexed and its bytes removed; a checkpoint a lease holds is
never planned again and goes at release; a put in flight is returned and goes once it
reports; the cache stores and serves again afterwards."""

from __future__ import annotations

import numpy as np
from cache_support import TINY, make_cache, save_seq

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.index.plan import ObjectSpec


def _clear(c, keys=None):
    with c.index.lock:
        waiting = c.index.clear(keys)
        c._run_drained()
    c.flush()
    return waiting


def _held(c) -> list:
    return [k for t in c.store.tiers for k in t.held_keys()]


def test_clear_forgets_every_object_and_its_bytes() -> None:
    c = make_cache()
    save_seq(c, np.arange(40), states=[16, 40])
    save_seq(c, np.r_[np.arange(20), np.arange(100, 120)], states=[32])
    assert len(c.index.table) > 0 and _held(c)
    assert _clear(c) == set()
    assert len(c.index.table) == 0 and not c.store.ledger.entries and _held(c) == []
    assert c.lookup(np.arange(100)).num_tokens == 0
    c.check_integrity()
    save_seq(c, np.arange(40), states=[16])  # stores and serves again
    assert c.lookup(np.arange(100)).num_tokens == 16
    c.check_integrity()


def test_a_leased_checkpoint_is_never_planned_again_and_goes_at_release() -> None:
    c = make_cache()
    save_seq(c, np.arange(40), states=[16])
    lease = c.acquire(c.lookup(np.arange(100)))
    assert lease is not None
    _clear(c)
    assert c.lookup(np.arange(100)).num_tokens == 0
    c.release(lease)
    c.flush()
    assert len(c.index.table) == 0 and _held(c) == []
    c.check_integrity()


def test_a_put_in_flight_is_cleared_once_it_reports() -> None:
    c = make_cache()
    toks = np.arange(24)
    kvb = TINY.kv_bytes_per_token()
    specs = [ObjectSpec(ObjectKind.KV, 0, 8, 8 * kvb), ObjectSpec(ObjectKind.STATE, 8, 8,
                                                                  TINY.state_bytes())]
    ticket = c.index.begin_save(toks, specs)
    keys = {k for k in ticket.keys if k is not None}
    assert len(keys) == 2
    assert _clear(c) == keys  # in flight: cannot be taken back yet
    c.index.complete_save(ticket, range(len(ticket.ops)), [True] * len(ticket.ops))
    assert _clear(c, keys) == set()
    assert len(c.index.table) == 0 and not c.store.ledger.entries
    c.check_integrity()


def test_a_new_epoch_keys_later_saves_apart_and_clears_the_old_ones_as_they_report() -> None:
    """``clear(new_epoch=True)``: the weights changed in memory. What is saved after it
    carries a fingerprint of its own; a put in flight from before still lands under the old
    one, is this index's (integrity holds) and is cleared once it reports."""
    c = make_cache()
    old = c.index.fingerprint
    kvb = TINY.kv_bytes_per_token()
    before = c.index.begin_save(np.arange(24), [ObjectSpec(ObjectKind.KV, 0, 8, 8 * kvb)])
    with c.index.lock:
        waiting = c.index.clear(new_epoch=True)
        c._run_drained()
    assert waiting and c.index.fingerprint != old and c.index.owns(old)
    save_seq(c, np.r_[np.arange(100, 140)], states=[16])
    assert {k.fingerprint for k in c.index.where} >= {c.index.fingerprint}
    c.check_integrity()  # the old put, still in flight, is this index's
    c.index.complete_save(before, range(len(before.ops)), [True] * len(before.ops))
    assert _clear(c, waiting) == set()
    assert {k.fingerprint for k in c.index.where} == {c.index.fingerprint}
    assert c.lookup(np.arange(100, 140)).num_tokens == 16  # the new epoch serves
    c.check_integrity()
