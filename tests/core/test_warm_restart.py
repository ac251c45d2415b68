"""Warm restart: a new cache over the same NVMe directory re-links what the previous run
stored and hits on the first request; objects whose metadata does not hash to their key
are never indexed; and what does not link is reclaimed first under pressure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from cache_support import SAVED, TINY, config, kv_items, made_for, payload

from hybrid_connector import assemble
from hybrid_connector.core.keys import ObjectKey, ObjectKind, PrefixHasher
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.runtime.session import RequestSession
from hybrid_connector.tiers.manager import build_store


def disk_config(path: Path, disk=None, **over):
    return config(local_disk=str(path), disk_fsync=False, pools={
        "device": {"kv": 0, "state": 0}, "host": {"kv": 0, "state": 0},
        "disk": disk or {"kv": 10**6, "state": 10**6, "anchor": 10**5}}, **over)


def run(cache, prompt, out):
    """One request through a session with geometry-sized payloads; returns the hit."""
    s = RequestSession(cache, prompt)
    loaded = s.load()
    if loaded.num_tokens:
        for obj, t in zip(s.plan.kv, loaded.kv, strict=True):
            assert made_for(t, prompt, min(obj.ref.end, s.plan.kv_tokens))
        assert SAVED[loaded.state.numpy().tobytes()] == tuple(int(x) for x in prompt[:s.hit])
    s.release()

    def kv(a, b, toks=prompt):
        return payload(toks, ObjectKind.KV, a, b)

    s.save_prefill(kv, {q: payload(prompt, ObjectKind.STATE, q, q) for q in s.checkpoints})
    s.extend(out)
    full = s.tokens.copy()
    end = cache.final_checkpoint(len(full))
    s.finish(lambda a, b: payload(full, ObjectKind.KV, a, b),
             {end: payload(full, ObjectKind.STATE, end, end)})
    return s.hit


def test_a_restart_over_the_same_directory_hits_on_the_first_request(tmp_path: Path) -> None:
    cfg = disk_config(tmp_path / "d")
    rng = np.random.default_rng(1)
    base = rng.integers(0, 60, 48)
    first = assemble.cache(cfg, TINY, build_store(cfg))
    prompts = [np.r_[base[: 20 + 7 * i], rng.integers(60, 64, 5)] for i in range(4)]
    for p in prompts:
        run(first, p, rng.integers(0, 60, 6))
    before = {k: first.index.where[k] for k in first.index.where}
    first.close()

    again = assemble.cache(cfg, TINY, build_store(cfg))
    assert sum(again.rebuilt.indexed.values()) == len(before)
    assert again.rebuilt.unlinked == ()
    assert set(again.index.where) == set(before)
    again.check_integrity()
    # the first request after the restart: a continuation of one the previous run served
    assert run(again, np.r_[prompts[2], [1, 2, 3]], []) > 0
    again.close()


def test_metadata_that_does_not_hash_to_its_key_is_never_indexed(tmp_path: Path) -> None:
    cfg = disk_config(tmp_path / "d")
    store = build_store(cfg)
    cache = assemble.cache(cfg, TINY, store)
    a = np.arange(16) + 5
    cache.save(a, kv_items(a, 0, 8))
    good = next(iter(cache.index.where))
    cache.close()
    # a file with a valid checksum whose metadata (tokens of ``a``, chained on a's first
    # chunk) does not hash to its key (made for other tokens)
    store = build_store(cfg)
    other = np.r_[a[:8], a[8:16] + 1]
    forged = ObjectKey(good.fingerprint, PrefixHasher(other, 4).at(16), ObjectKind.KV, 8, 16)
    bad = ObjectMeta.for_range(a, 8, 16, ObjectKind.KV, PrefixHasher(a, 4))
    assert store.put([(forged, payload(other, ObjectKind.KV, 8, 16))], metas=[bad]) == [True]
    store.close()
    again = assemble.cache(cfg, TINY, build_store(cfg))
    assert forged in again.rebuilt.unlinked and forged not in again.index.where
    assert good in again.index.where                   # the honest chunk re-linked
    again.check_integrity()
    again.close()


def test_unlinked_objects_are_reclaimed_first(tmp_path: Path) -> None:
    cfg = disk_config(tmp_path / "d", disk={"kv": 4 * 8 * 16, "state": 10 * 28})
    store = build_store(cfg)
    lone = ObjectKey(assemble.cache(cfg, TINY, store).fingerprint, b"\x01" * 16, ObjectKind.KV, 8, 16)
    store.close()
    store = build_store(cfg)
    assert store.put([(lone, torch.zeros(8 * 16, dtype=torch.uint8))]) == [True]  # no meta
    store.close()
    cache = assemble.cache(cfg, TINY, build_store(cfg))
    assert lone in cache.rebuilt.unlinked
    a = np.arange(32) + 1
    r = cache.save(a, kv_items(a, 0, 32))               # needs the lone chunk's room
    assert r.stored == 4 and cache.store.where([lone]) == [None]
    cache.close()


def test_an_unlinked_object_saved_again_is_stored_not_refused(tmp_path: Path) -> None:
    """A warm restart leaves an object it cannot re-link in the ledger (here: the chunk
    before it is gone); the next save of the same key must store it, not raise "already
    placed" (found by the vLLM connector's restart test)."""
    cfg = disk_config(tmp_path / "d")
    cache = assemble.cache(cfg, TINY, build_store(cfg))
    a = np.arange(16) + 5
    cache.save(a, kv_items(a, 0, 8) + kv_items(a, 8, 16))
    head = next(k for k in cache.index.where if k.start == 0)
    tail = next(k for k in cache.index.where if k.start == 8)
    cache.close()
    (tmp_path / "d" / head.digest()).unlink()            # the chain's first link is lost
    again = assemble.cache(cfg, TINY, build_store(cfg))
    assert tail in again.rebuilt.unlinked and tail not in again.index.where
    r = again.save(a, kv_items(a, 0, 8) + kv_items(a, 8, 16))
    again.flush()
    assert r.stored == 2 and {head, tail} <= set(again.index.where)
    assert again.store.where([tail]) == ["nvme"]
    again.check_integrity()
    again.close()
