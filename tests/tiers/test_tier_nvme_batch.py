"""Batched NVMe I/O (group commit, pooled reads, header cache): the answers are those of
the same calls made one object at a time, whatever the batch holds."""

from __future__ import annotations

import os
import random
import shutil
import signal
from pathlib import Path

import torch
from tier_helpers import make_key, make_payload, same_bits

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tiers.nvme import NvmeTier

K = ObjectKind
BIG = {k: 1 << 30 for k in K}


def test_repeated_key_in_one_batch_keeps_the_last(tmp_path: Path) -> None:
    tier = NvmeTier(tmp_path / "n", BIG, io_threads=4)
    k = make_key(1)
    vs = [make_payload(i, (1000,)) for i in range(3)]
    assert tier.put([(k, vs[0]), (make_key(2), vs[1]), (k, vs[1]), (k, vs[2])]) == [True] * 4
    assert same_bits(tier.get([k])[0], vs[2])
    assert tier.used(K.KV) == 2 * 4000
    tier.close()
    again = NvmeTier(tmp_path / "n", BIG)
    assert same_bits(again.get([k])[0], vs[2])


def test_batches_answer_as_one_by_one(tmp_path: Path) -> None:
    """Random batches (overwrites, repeats, bad payloads, a tight budget) on a 4-thread
    tier and on a 1-thread tier give the same answers, contents, usage and LRU order."""
    budget = {K.KV: 60_000, K.STATE: 40_000, K.ANCHOR: 30_000}
    par = NvmeTier(tmp_path / "par", budget, io_threads=4)
    seq = NvmeTier(tmp_path / "seq", budget, io_threads=1)
    rnd = random.Random(5)
    for step in range(60):
        batch = []
        for j in range(rnd.randrange(1, 9)):
            key = make_key(rnd.randrange(8), rnd.choice(list(K)))
            t = make_payload(step * 10 + j, (rnd.randrange(1, 3000),))
            if rnd.random() < 0.1:
                t = t.reshape(-1, 1).expand(-1, 2)  # not contiguous: refused
            batch.append((key, t))
        assert par.put(batch) == seq.put(batch)
        if rnd.random() < 0.3:
            gone = [make_key(rnd.randrange(8), rnd.choice(list(K)))]
            assert par.remove(gone) == seq.remove(gone)
        keys = [make_key(rnd.randrange(8), rnd.choice(list(K))) for _ in range(rnd.randrange(1, 7))]
        a, b = par.get(keys), seq.get(keys)
        assert [x is None for x in a] == [x is None for x in b]
        assert all(x is None or same_bits(x, y) for x, y in zip(a, b, strict=True) if y is not None)
        for kind in K:
            assert par.used(kind) == seq.used(kind)
            assert list(par.lru(kind)) == list(seq.lru(kind))
    sp, ss = par.stats(), seq.stats()
    assert (sp.puts, sp.put_failures, sp.hits, sp.misses) == (ss.puts, ss.put_failures, ss.hits, ss.misses)
    assert sp.put_failures > 0 and sp.misses > 0  # the budget and the misses were exercised


def test_get_into_batch_answers_per_element(tmp_path: Path) -> None:
    tier = NvmeTier(tmp_path / "n", BIG, io_threads=4)
    items = [(make_key(i), make_payload(i, (5000,))) for i in range(6)]
    assert all(tier.put(items))
    keys = [items[0][0], make_key(99), items[2][0], items[2][0], items[3][0]]
    outs = [torch.empty(5000), torch.empty(5000), torch.empty(5000), torch.empty(5000),
            torch.empty(4999)]  # a miss, a repeat, a wrong-sized buffer
    assert tier.get_into(keys, outs) == [True, False, True, True, False]
    assert same_bits(outs[0], items[0][1]) and same_bits(outs[3], items[2][1])
    assert tier.pin_count(items[2][0]) == 0  # every read unpinned


def test_cached_header_never_vouches_for_a_changed_file(tmp_path: Path) -> None:
    """After warm reads (headers cached), another object's valid file moved under a name,
    or a flipped payload byte, is still a miss and dropped, never served."""
    d = tmp_path / "n"
    tier = NvmeTier(d, BIG, io_threads=4)
    items = [(make_key(i), make_payload(i, (20_000,))) for i in range(4)]
    assert all(tier.put(items))
    keys = [k for k, _ in items]
    assert all(x is not None for x in tier.get(keys))  # headers now cached
    shutil.copyfile(d / keys[1].digest(), d / keys[0].digest())  # a valid file, other key
    f = d / keys[2].digest()
    raw = bytearray(f.read_bytes())
    raw[-100] ^= 0x10  # same header bytes, payload off by one bit
    f.write_bytes(raw)
    got = tier.get(keys)
    assert got[0] is None and got[2] is None
    assert same_bits(got[1], items[1][1]) and same_bits(got[3], items[3][1])
    assert set(tier.held_keys()) == {keys[1], keys[3]}


def test_pool_survives_fork(tmp_path: Path) -> None:
    """A child that inherits a tier whose pool already ran starts a fresh pool (the
    parent's threads do not exist in it) instead of hanging."""
    tier = NvmeTier(tmp_path / "n", BIG, io_threads=4)
    items = [(make_key(i), make_payload(i, (100,))) for i in range(4)]
    assert all(tier.put(items))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            signal.alarm(20)  # a hang kills the child instead of the test run
            more = [(make_key(10 + i), make_payload(10 + i, (100,))) for i in range(4)]
            ok = all(tier.put(more)) and all(x is not None for x in tier.get([k for k, _ in more]))
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert all(x is not None for x in tier.get([k for k, _ in items]))
    tier.close()


def test_overwrite_early_in_a_batch_frees_room_for_a_later_item(tmp_path: Path) -> None:
    """Stored one by one, the overwrite of a (6000 -> 1000 bytes) frees the room b needs;
    the batch must not refuse b for room that its own earlier item gives back."""
    tier = NvmeTier(tmp_path / "n", {K.KV: 10_000}, io_threads=4)
    a, b = make_key(1), make_key(2)
    assert tier.put([(a, make_payload(1, (1500,)))]) == [True]
    va, vb = make_payload(2, (250,)), make_payload(3, (1250,))
    assert tier.put([(a, va), (b, vb)]) == [True, True]
    assert same_bits(tier.get([a])[0], va) and same_bits(tier.get([b])[0], vb)
    assert tier.used(K.KV) == 6000
