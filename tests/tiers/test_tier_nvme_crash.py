"""Crash test: a child process writing to the NVMe tier is SIGKILLed at random points.

Each round forks a child (fork, not spawn: re-importing torch 50 times would take minutes)
that runs a deterministic sequence of puts, overwrites and removes on one directory and
reports every completed operation through a pipe. The parent kills it with SIGKILL after a
random delay, restarts the tier on the same directory and checks:

* every object whose put completed (and was not later removed) reads back bit-identical,
  except the one operation that may have been in flight, which may show either state;
* no object that reads back differs from some version ever written for its key (no
  corrupt object is ever returned), and no temporary file survives a restart.

The child builds payloads with numpy (no torch thread pools after fork) and keeps them
under 1 MiB (single-threaded hashing), so nothing in it depends on threads of the parent.
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

ROUNDS = 60
NKEYS = 24
BUDGET = {k: 256 << 20 for k in ObjectKind}
KINDS = list(ObjectKind)


def op_at(seed: int, n: int) -> tuple[str, ObjectKey, int]:
    """The n-th operation of the sequence: (put|remove, key, version)."""
    r = random.Random(seed * 1_000_003 + n)
    key = make_key(r.randrange(NKEYS), KINDS[r.randrange(3)])
    return ("remove" if r.random() < 0.15 else "put"), key, n


def payload(key: ObjectKey, version: int) -> torch.Tensor:
    rng = np.random.default_rng(hash((key.digest(), version)) & 0xFFFFFFFF)
    n = int(rng.integers(1, 1 << 18))  # up to 256 Ki elements (< 1 MiB as bf16/int16)
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    t = torch.from_numpy(bits)
    return t.view(torch.bfloat16) if version % 2 else t.view(torch.int16).reshape(1, n)


def child(path: Path, seed: int, start: int, wfd: int) -> None:
    tier = NvmeTier(path, BUDGET, zstd={ObjectKind.STATE: 1})
    n = start
    while True:
        op, key, version = op_at(seed, n)
        if op == "put":
            assert tier.put([(key, payload(key, version))]) == [True]
        else:
            tier.remove([key])
        os.write(wfd, f"{n}\n".encode())
        n += 1


def run_round(path: Path, seed: int, start: int, delay: float) -> int:
    """Fork a writer, kill it ``delay`` s after its first report (a slow start on a busy
    host eats none of its time); return how many ops it reported done."""
    buf = fork_and_kill(lambda wfd: child(path, seed, start, wfd), delay, from_first_report=True)
    done = [int(x) for x in buf.split(b"\n")[:-1]]  # a torn last line is not a report
    assert done == list(range(start, start + len(done)))
    return len(done)


def fingerprint(t: torch.Tensor) -> tuple[str, tuple[int, ...], str]:
    return str(t.dtype), tuple(t.shape), checksum(raw_bytes(t).data)


def test_sigkill_during_writes_never_loses_completed_or_returns_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "nvme"
    rnd = random.Random(1234)
    seed = 7
    expected: dict[ObjectKey, int | None] = {}  # latest completed version (None: removed)
    versions: dict[ObjectKey, dict[tuple[str, tuple[int, ...], str], int]] = {}

    def remember(key: ObjectKey, version: int) -> None:
        versions.setdefault(key, {})[fingerprint(payload(key, version))] = version

    def version_of(key: ObjectKey, got: torch.Tensor | None) -> int | None:
        if got is None:
            return None
        v = versions.get(key, {}).get(fingerprint(got))
        assert v is not None, f"{key} returned bytes that were never written (corrupt)"
        return v

    n = 0
    kills_mid_sequence = torn_writes = 0
    for _ in range(ROUNDS):
        ndone = run_round(path, seed, n, delay=rnd.uniform(0.0, 0.12))
        for i in range(n, n + ndone):
            op, key, version = op_at(seed, i)
            expected[key] = version if op == "put" else None
            if op == "put":
                remember(key, version)
        n += ndone
        # the op that may have been in flight when the child died
        fop, fkey, fversion = op_at(seed, n)
        if fop == "put":
            remember(fkey, fversion)
        kills_mid_sequence += ndone > 0

        torn_writes += any(p.name.endswith(".tmp") for p in path.iterdir())
        tier = NvmeTier(path, BUDGET)  # restart: rebuild the index from the directory
        assert not [p for p in path.iterdir() if p.name.endswith(".tmp")]
        assert tier.dropped_at_start == []  # atomic renames: nothing torn ever visible
        for key in set(expected) | {fkey}:
            state = version_of(key, tier.get([key])[0])
            ok_states = {expected.get(key)}
            if key == fkey:
                ok_states.add(fversion if fop == "put" else None)
            assert state in ok_states, (key, state, ok_states)
            expected[key] = state  # the in-flight op resolved one way or the other
        assert set(tier.held_keys()) == {k for k, v in expected.items() if v is not None}
        tier.close()
    print(f"{ROUNDS} kills, {torn_writes} during a write, {n} ops completed")
    assert kills_mid_sequence >= ROUNDS // 2
    assert torn_writes >= ROUNDS // 10  # the kills really hit writes in progress
    assert n > ROUNDS  # the children made progress
