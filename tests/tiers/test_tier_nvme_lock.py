"""One NVMe directory, one live store: a second store opening it (another process or this
one) is refused before it touches a file, naming the path and the holder's pid; the lock
goes with the holder (``close``, or the OS when it dies), so a warm restart works."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from nvme_holder import SHAPE
from tier_helpers import make_key, make_payload, same_bits

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tiers.dirlock import LOCK_NAME, DirectoryLocked
from hybrid_connector.tiers.nvme import NvmeTier

HOLDER = Path(__file__).resolve().parent / "nvme_holder.py"
ROOT = Path(__file__).resolve().parents[2]
N = 120
SMALL = {k: 32 << 20 for k in ObjectKind}  # the second store's budget: less than A holds
BIG = {k: 64 << 20 for k in ObjectKind}


@contextmanager
def holder(path: Path, n: int) -> Iterator[subprocess.Popen[str]]:
    """A real second process holding ``NvmeTier(path)`` with ``n`` acknowledged objects."""
    proc = subprocess.Popen([sys.executable, str(HOLDER), str(path), str(n)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until ready (or the child died: "")
        assert line == f"ready {proc.pid}\n", line
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()


def all_there(tier: NvmeTier, n: int) -> bool:
    got = tier.get([make_key(i) for i in range(n)])
    return all(same_bits(g, make_payload(i, SHAPE)) for i, g in enumerate(got))


def test_a_second_process_cannot_open_a_live_directory_and_a_killed_holder_restarts(
        tmp_path: Path) -> None:
    path = tmp_path / "nvme"
    with holder(path, N) as proc:
        with pytest.raises(DirectoryLocked) as err:
            NvmeTier(path, SMALL)  # would drop A's files to fit its budget, then write its own
        assert str(path) in str(err.value) and f"pid {proc.pid}" in str(err.value)
        assert len([p for p in path.iterdir() if not p.name.startswith(".")]) == N
        proc.kill()  # SIGKILL: no close; the OS releases the lock
        proc.wait(60)
    tier = NvmeTier(path, BIG)  # warm restart over what the dead holder acknowledged
    try:
        assert tier.dropped_at_start == [] and all_there(tier, N)
    finally:
        tier.close()


def test_a_closed_holder_hands_over_to_a_later_store(tmp_path: Path) -> None:
    path = tmp_path / "nvme"
    with holder(path, 3) as proc:
        assert proc.stdin is not None
        proc.stdin.close()  # the holder closes its tier and exits
        assert proc.wait(60) == 0
    tier = NvmeTier(path, BIG)
    try:
        assert all_there(tier, 3)
    finally:
        tier.close()


def test_in_one_process_a_second_store_waits_for_close(tmp_path: Path) -> None:
    import os

    first = NvmeTier(tmp_path, BIG)
    assert first.put([(make_key(0), make_payload(0, SHAPE))]) == [True]
    with pytest.raises(DirectoryLocked, match=f"pid {os.getpid()}"):
        NvmeTier(tmp_path, SMALL)
    assert (tmp_path / LOCK_NAME).read_text().split()[0] == str(os.getpid())
    first.close()
    second = NvmeTier(tmp_path, SMALL)  # close released the lock
    try:
        assert all_there(second, 1)
    finally:
        second.close()


def test_tp_ranks_lock_their_own_subdirectories(tmp_path: Path) -> None:
    ranks = [NvmeTier(tmp_path / f"rank{r}", BIG) for r in range(2)]
    try:
        for r, tier in enumerate(ranks):
            assert tier.put([(make_key(r), make_payload(r, SHAPE))]) == [True]
        with pytest.raises(DirectoryLocked, match="rank1"):
            NvmeTier(tmp_path / "rank1", BIG)
    finally:
        for tier in ranks:
            tier.close()
