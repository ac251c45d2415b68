"""Crash test of the group commit: the writer is SIGKILLed in the middle of batched puts.

Each round forks a child (fork, as in test_tier_nvme_crash.py) that stores a deterministic
sequence of batches (2 to 9 objects of every kind, overwrites and repeated keys within a
batch included) through one ``NvmeTier.put`` per batch, with ``fsync`` on and four I/O
threads, so every batch is one group commit: temporary files written and fsynced in
parallel, renamed, one directory fsync. The child reports "s<n>" before batch n's put and
"d<n>" once it returned (acknowledged). The parent kills it after a random delay, which
mostly lands inside a put, restarts the tier on the directory and checks:

* no read ever returns bytes that were not written for its key (no corrupt read), no file
  is dropped at start as torn, and no temporary file survives the restart;
* every object of an acknowledged batch is present with its acknowledged version; a key
  of the batch in flight at the kill shows its previous state or one of the versions that
  batch wrote for it (the commit is per object, not all-or-nothing).

A SIGKILL keeps the page cache, so this checks what the directory says after a crash
(atomic renames, index rebuilt from it); that fsync makes it durable against power loss is
the kernel's contract, which the tier honours by fsyncing each file before its rename and
the directory before ``put`` returns.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch
from crash_support import fork_and_kill
from tier_helpers import make_key

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.codec import checksum, raw_bytes
from hybrid_connector.tiers.nvme import NvmeTier

ROUNDS = 40
NKEYS = 20
BUDGET = {k: 512 << 20 for k in ObjectKind}
KINDS = list(ObjectKind)


def batch_at(seed: int, n: int) -> list[tuple[ObjectKey, int]]:
    """Batch n of the sequence: (key, version) pairs; a version is unique to one put."""
    r = random.Random(seed * 1_000_003 + n)
    return [(make_key(r.randrange(NKEYS), KINDS[r.randrange(3)]), n * 100 + j)
            for j in range(r.randrange(2, 10))]


def payload(key: ObjectKey, version: int) -> torch.Tensor:
    rng = np.random.default_rng(hash((key.digest(), version)) & 0xFFFFFFFF)
    n = int(rng.integers(1, 1 << 18))  # up to 256 Ki elements (< 1 MiB as bf16/int16)
    t = torch.from_numpy(rng.integers(0, 1 << 16, size=n, dtype=np.uint16))
    return t.view(torch.bfloat16) if version % 2 else t.view(torch.int16).reshape(1, n)


def child(path: Path, seed: int, start: int, wfd: int) -> None:
    tier = NvmeTier(path, BUDGET, zstd={ObjectKind.STATE: 1}, fsync=True, io_threads=4)
    n = start
    while True:
        items = [(k, payload(k, v)) for k, v in batch_at(seed, n)]
        os.write(wfd, f"s{n}\n".encode())
        assert all(tier.put(items))
        os.write(wfd, f"d{n}\n".encode())
        n += 1


def run_round(path: Path, seed: int, start: int, delay: float) -> tuple[int, bool]:
    """Fork a writer, kill it ``delay`` s after it started its first batch (its tier's start
    is not counted); return (batches acknowledged, whether the kill hit a put in progress)."""
    buf = fork_and_kill(lambda wfd: child(path, seed, start, wfd), delay, from_first_report=True)
    lines = buf.split(b"\n")[:-1]  # a torn last line is not a report
    done = [int(x[1:]) for x in lines if x.startswith(b"d")]
    started = [int(x[1:]) for x in lines if x.startswith(b"s")]
    assert done == list(range(start, start + len(done)))
    return len(done), bool(started) and started[-1] == start + len(done)


def fingerprint(t: torch.Tensor) -> tuple[str, tuple[int, ...], str]:
    return str(t.dtype), tuple(t.shape), checksum(raw_bytes(t).data)


def test_sigkill_mid_group_commit_keeps_every_acknowledged_object(tmp_path: Path) -> None:
    path = tmp_path / "nvme"
    rnd = random.Random(4321)
    seed = 11
    expected: dict[ObjectKey, int] = {}  # latest acknowledged version per key
    versions: dict[ObjectKey, dict[tuple[str, tuple[int, ...], str], int]] = {}

    def remember(key: ObjectKey, version: int) -> None:
        versions.setdefault(key, {})[fingerprint(payload(key, version))] = version

    n = mid_commit = torn = 0
    for _ in range(ROUNDS):
        ndone, in_put = run_round(path, seed, n, delay=rnd.uniform(0.0, 0.15))
        for b in range(n, n + ndone):
            for key, version in batch_at(seed, b):
                expected[key] = version
                remember(key, version)
        n += ndone
        flight = batch_at(seed, n)  # the batch that may have been in flight
        for key, version in flight:
            remember(key, version)
        mid_commit += in_put
        torn += any(p.name.endswith(".tmp") for p in path.iterdir())

        tier = NvmeTier(path, BUDGET)  # restart: rebuild the index from the directory
        assert not [p for p in path.iterdir() if p.name.endswith(".tmp")]
        assert tier.dropped_at_start == []  # atomic renames: nothing torn ever visible
        keys = sorted(set(expected) | {k for k, _ in flight}, key=lambda k: k.digest())
        for key, got in zip(keys, tier.get(keys), strict=True):
            state = None
            if got is not None:
                state = versions.get(key, {}).get(fingerprint(got))
                assert state is not None, f"{key} returned bytes never written (corrupt)"
            ok = {expected.get(key)}
            ok |= {v for k, v in flight if k == key}
            assert state in ok, (key, state, ok)
            if state is not None:
                expected[key] = state  # the in-flight put resolved one way or the other
        assert set(tier.held_keys()) == set(expected)
        tier.close()
    print(f"{ROUNDS} kills, {mid_commit} inside a put, {torn} with temp files, {n} batches")
    assert n > ROUNDS // 2  # the children made progress
    assert mid_commit >= ROUNDS // 2  # the kills really hit group commits in progress
    assert torn >= ROUNDS // 10  # ... some before every file of the batch was renamed
