"""Fault tests with real failures (no mocks): disk full, unreadable files, a remote that is
down or stalls. The engine-facing call returns a miss / False, logs once, never raises."""

from __future__ import annotations

import logging
import os
import resource
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tier_helpers import make_key, make_payload, same_bits
from tier_servers import StalledServer, run_redis

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.dirlock import LOCK_NAME
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.manager import TieredStore
from hybrid_connector.tiers.nvme import NvmeTier
from hybrid_connector.tiers.remote.tier import RemoteTier

K = ObjectKind
BIG = {k: 1 << 30 for k in K}  # budgets far above the disk, so the disk is what fills


def warnings_from(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and r.levelno >= logging.WARNING]


# ------------------------------------------------------------------ disk full
@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (needs mount privileges; skipped without them)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount binary")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_until_full(tier: NvmeTier, n: int = 40) -> tuple[list[tuple[ObjectKey, torch.Tensor]], list[bool]]:
    items = [(make_key(i), make_payload(i, (64 * 1024,), torch.float32)) for i in range(n)]  # 256 KiB
    return items, [tier.put([it])[0] for it in items]


def test_disk_full_on_a_real_tmpfs(tiny_tmpfs: Path, caplog: pytest.LogCaptureFixture) -> None:
    tier = NvmeTier(tiny_tmpfs / "nvme", BIG)
    with caplog.at_level(logging.WARNING):
        items, ok = fill_until_full(tier, 10)
    assert ok[0] and not all(ok)  # some fit, then ENOSPC
    assert len(warnings_from(caplog, "hybrid_connector.tiers.nvme")) == 1  # logged once, not per put
    assert "disk full" in caplog.text
    for (k, v), stored in zip(items, ok, strict=True):  # what was stored is intact
        got = tier.get([k])[0]
        assert (same_bits(got, v) if stored else got is None)
    assert not [p for p in (tiny_tmpfs / "nvme").iterdir() if p.name.endswith(".tmp")]
    assert tier.used(K.KV) == sum(stored for stored in ok) * 256 * 1024
    # freeing space makes puts work again
    tier.remove([items[0][0]])
    assert tier.put([items[-1]]) == [True]


def test_disk_full_demotion_drops_are_reported(tiny_tmpfs: Path) -> None:
    m = TieredStore([HostTier({K.KV: 512 * 1024}), NvmeTier(tiny_tmpfs / "nvme", BIG)])
    dropped: list[ObjectKey] = []
    m.set_drop_listener(dropped.extend)
    items = [(make_key(i), make_payload(i, (64 * 1024,))) for i in range(10)]
    assert all(m.put(items))  # puts land on the host; victims go down or are dropped
    present = [k for k, w in zip([k for k, _ in items], m.where([k for k, _ in items]), strict=True) if w]
    assert dropped and set(dropped).isdisjoint(present)
    assert len(dropped) + len(present) == len(items)  # nothing vanished silently
    for k, v in items:
        if k in present:
            assert same_bits(m.get([k])[0], v)
    m.close()


def test_disk_full_via_file_size_limit(tmp_path: Path) -> None:
    """ENOSPC's sibling EFBIG, for real: a forked child with RLIMIT_FSIZE (works without
    mount privileges). The child reports its results through a pipe."""
    path = tmp_path / "nvme"
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            os.close(rfd)
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of a kill
            resource.setrlimit(resource.RLIMIT_FSIZE, (300 * 1024, 300 * 1024))
            tier = NvmeTier(path, BIG)
            small = make_payload(1, (1024,))
            big = make_payload(2, (128 * 1024,))  # 512 KiB > the limit
            res = [tier.put([(make_key(1), small)])[0], tier.put([(make_key(2), big)])[0],
                   same_bits(tier.get([make_key(1)])[0], small), tier.get([make_key(2)])[0] is None]
            os.write(wfd, ",".join(str(int(x)) for x in res).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    _, status = os.waitpid(pid, 0)
    out = os.read(rfd, 100).decode()
    os.close(rfd)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert out == "1,0,1,1"
    tier = NvmeTier(path, BIG)  # the failed write left nothing behind
    assert [k.prefix for k in tier.held_keys()] == [make_key(1).prefix]
    assert not [p for p in path.iterdir() if p.name.endswith(".tmp")]


# ------------------------------------------------------------------ unreadable files
@pytest.mark.parametrize("damage", ["truncate", "flip_body", "flip_header", "directory", "empty"])
def test_unreadable_file_is_a_miss_and_dropped(tmp_path: Path, damage: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    tier = NvmeTier(tmp_path / "nvme", BIG)
    k, v = make_key(1), make_payload(1, (1000,), torch.bfloat16)
    k2, v2 = make_key(2), make_payload(2, (10,))
    assert tier.put([(k, v), (k2, v2)]) == [True, True]
    f = tmp_path / "nvme" / k.digest()
    data = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(data[: len(data) - 7])
    elif damage == "flip_body":
        f.write_bytes(data[:-1] + bytes([data[-1] ^ 0x01]))
    elif damage == "flip_header":
        f.write_bytes(data[:20] + bytes([data[20] ^ 0x40]) + data[21:])
    elif damage == "directory":  # root ignores chmod 000; a directory cannot be read as a file
        f.unlink()
        f.mkdir()
    else:
        f.write_bytes(b"")
    m = TieredStore([tier])
    dropped: list[ObjectKey] = []
    m.set_drop_listener(dropped.extend)
    with caplog.at_level(logging.WARNING):
        assert m.get([k, k]) == [None, None]  # a miss, never an exception, never garbage
        assert m.get_into([k], [torch.empty_like(v)]) == [False]
    assert len(warnings_from(caplog, "hybrid_connector.tiers.nvme")) == 1
    assert dropped == [k]  # the index hears about it once, so it stops promising it
    assert m.where([k]) == [None] and tier.used(K.KV) == 10 * 4
    assert same_bits(m.get([k2])[0], v2)  # the neighbour is untouched
    # a restart drops whatever is still damaged and keeps the rest
    tier.close()  # one live store per directory
    t2 = NvmeTier(tmp_path / "nvme", BIG)
    assert t2.held_keys() == [k2]


@pytest.mark.parametrize("damage", ["truncate", "append", "flip_header", "directory"])
def test_unverified_reads_still_reject_structural_damage(tmp_path: Path, damage: str) -> None:
    tier = NvmeTier(tmp_path / "nvme", BIG, verify_reads=False)
    k, v = make_key(1), make_payload(1, (1000,), torch.bfloat16)
    assert tier.put([(k, v)]) == [True]
    assert same_bits(tier.get([k])[0], v)
    f = tmp_path / "nvme" / k.digest()
    data = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(data[:-1])
    elif damage == "append":
        f.write_bytes(data + b"x")
    elif damage == "flip_header":
        f.write_bytes(data[:20] + bytes([data[20] ^ 0x40]) + data[21:])
    else:
        f.unlink()
        f.mkdir()
    assert tier.get([k]) == [None]


def test_restart_drops_corrupt_files_it_finds(tmp_path: Path) -> None:
    tier = NvmeTier(tmp_path / "nvme", BIG)
    items = [(make_key(i), make_payload(i, (100,))) for i in range(4)]
    tier.put(items)
    d = tmp_path / "nvme"
    (d / items[0][0].digest()).write_bytes(b"HCT1garbage")
    os.truncate(d / items[1][0].digest(), 50)
    (d / items[2][0].digest()).rename(d / items[3][0].digest().replace("a", "b", 1).replace("0", "1", 1))
    (d / ".stale.1.2.3.tmp").write_bytes(b"half a write")
    tier.close()  # restarts below: one live store per directory
    t2 = NvmeTier(d, BIG)
    assert t2.held_keys() == [items[3][0]]
    assert len(t2.dropped_at_start) == 3
    assert sorted(p.name for p in d.iterdir() if p.name != LOCK_NAME) == [items[3][0].digest()]
    t2.close()
    # verify_on_start also checks every checksum
    f = d / items[3][0].digest()
    b = f.read_bytes()
    f.write_bytes(b[:-1] + bytes([b[-1] ^ 1]))
    assert NvmeTier(d, BIG).held_keys() == [items[3][0]]  # header-only scan keeps it
    assert NvmeTier(d, BIG, verify_on_start=True).held_keys() == []


def test_shrunk_budget_drops_oldest_at_start(tmp_path: Path) -> None:
    tier = NvmeTier(tmp_path / "nvme", BIG)
    items = [(make_key(i), make_payload(i, (256,))) for i in range(4)]  # 1 KiB each
    for age, it in enumerate(items):
        tier.put([it])
        os.utime(tmp_path / "nvme" / it[0].digest(), (1e9 + age, 1e9 + age))  # distinct mtimes
    tier.close()  # a restart: one live store per directory
    t2 = NvmeTier(tmp_path / "nvme", {K.KV: 2048})
    assert set(t2.held_keys()) == {items[2][0], items[3][0]}
    assert t2.used(K.KV) == 2048


# ------------------------------------------------------------------ remote down / stalled
def _remote_calls_never_raise(tier: RemoteTier, n: int = 5) -> None:
    k, v = make_key(1), make_payload(1, (64,))
    for _ in range(n):
        assert tier.put([(k, v)]) == [False]
        assert tier.get([k]) == [None]
        assert tier.contains([k]) == [False]


@pytest.mark.parametrize("scheme", ["lm", "redis"])
def test_remote_down_is_a_miss_logged_once(scheme: str, dead_port: int,
                                           caplog: pytest.LogCaptureFixture) -> None:
    url = f"{scheme}://127.0.0.1:{dead_port}" + ("/0" if scheme == "redis" else "")
    tier = RemoteTier(url, BIG, timeout=0.5, min_backoff=60)
    with caplog.at_level(logging.WARNING):
        _remote_calls_never_raise(tier)
    assert len(warnings_from(caplog, "hybrid_connector.tiers.remote.tier")) == 1
    # One call failed on the network; the backoff answered every later one without it.
    assert tier.is_down and tier.failures == 1


@pytest.mark.parametrize("scheme", ["lm", "redis"])
@pytest.mark.timeout(30)  # only to turn a regression into a failure, not a timing check
def test_remote_stall_times_out_to_a_miss(scheme: str, stalled_server: StalledServer,
                                          caplog: pytest.LogCaptureFixture) -> None:
    url = f"{scheme}://{stalled_server.addr}" + ("/0" if scheme == "redis" else "")
    tier = RemoteTier(url, BIG, timeout=0.3, min_backoff=60)
    with caplog.at_level(logging.WARNING):
        _remote_calls_never_raise(tier)
    assert len(warnings_from(caplog, "hybrid_connector.tiers.remote.tier")) == 1
    # The first call timed out (a miss); the backoff answered the other 14 without the
    # network: the server saw one connection.
    assert tier.failures == 1 and stalled_server.accepted == 1
    assert not tier.healthy()
    assert stalled_server.accepted == 1


def test_remote_going_down_after_puts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Objects indexed on a server that then dies: reads are misses through the manager,
    nothing is reported lost while it is only unreachable, and the host keeps working."""
    with run_redis(tmp_path) as url:
        remote = RemoteTier(url, BIG, timeout=0.5, min_backoff=0.2, max_backoff=0.2)
        m = TieredStore([HostTier({K.KV: 1024}), remote])
        dropped: list[ObjectKey] = []
        m.set_drop_listener(dropped.extend)
        items = [(make_key(i), make_payload(i, (64,))) for i in range(8)]
        assert all(m.put(items))
        assert m.where([items[0][0]]) == ["remote"]
    # the server is gone now
    with caplog.at_level(logging.WARNING):
        assert m.get([items[0][0]]) == [None]
        assert m.get([items[1][0]]) == [None]
    # unreachable is not lost: still indexed, nothing reported for them
    assert m.where([items[0][0], items[1][0]]) == ["remote", "remote"]
    assert not dropped
    with caplog.at_level(logging.WARNING):
        more = [(make_key(100 + i), make_payload(100 + i, (64,))) for i in range(4)]
        assert all(m.put(more))  # the host takes them (their remote copies fail)
    assert len(warnings_from(caplog, "hybrid_connector.tiers.remote.tier")) == 1
    # host victims written through before the outage keep their remote copy: indexed there,
    # misses while it is down, never reported as drops
    assert not dropped and set(m.where([k for k, _ in items[4:]])) == {"remote"}
    for k, v in more:
        assert same_bits(m.get([k])[0], v)
    m.close()
