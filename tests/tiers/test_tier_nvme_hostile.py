"""NVMe tier against a hostile or broken directory: FIFOs and symlinks under object names,
crafted (CRC-valid) headers, and removals the filesystem refuses (a real read-only
mount, a real immutable file). Hangs are caught by running the call in a thread that must
finish, so a regression fails instead of blocking the suite."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hostile_peers import crafted_blob, zstd_frame_claiming
from tier_helpers import make_key, make_payload, same_bits

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers import codec
from hybrid_connector.tiers.dirlock import LOCK_NAME
from hybrid_connector.tiers.manager import TieredStore
from hybrid_connector.tiers.nvme import NvmeTier

K = ObjectKind
BIG = {k: 1 << 30 for k in K}
HUGE = {k: 1 << 42 for k in K}  # so that only validation, not the budget, can refuse


def finishes(fn: Callable[[], Any], unblock: Callable[[], None], timeout: float = 5) -> Any:
    """``fn()``'s result; fails the test (after ``unblock`` frees the stuck thread) if it
    does not return within ``timeout``."""
    out: list[Any] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            err.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        unblock()
        pytest.fail("hung on a non-regular file")
    if err:
        raise err[0]
    return out[0]


def release_fifo(path: Path) -> Callable[[], None]:
    def go() -> None:
        with contextlib.suppress(OSError):  # a writer lets a blocked open() of it return
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    return go


# ------------------------------------------------------------------ item 16: non-regular files
@pytest.mark.parametrize("kind", ["fifo", "symlink_to_fifo", "symlink_to_object"])
def test_non_regular_file_named_like_an_object_is_dropped_at_start(tmp_path: Path, kind: str) -> None:
    d = tmp_path / "nvme"
    tier = NvmeTier(d, BIG)
    good, gv = make_key(1), make_payload(1)
    other, ov = make_key(2), make_payload(2)
    assert tier.put([(good, gv), (other, ov)]) == [True, True]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fifo = elsewhere / "fifo"
    os.mkfifo(fifo)
    victim = d / other.digest()
    if kind == "fifo":
        victim.unlink()
        os.mkfifo(victim)
        fifo = victim
    elif kind == "symlink_to_fifo":
        victim.unlink()
        victim.symlink_to(fifo)
    else:  # a valid object file, but reached through a symlink: regular files only
        target = elsewhere / other.digest()
        victim.rename(target)
        victim.symlink_to(target)
    tier.close()  # a restart: one live store per directory
    t2 = finishes(lambda: NvmeTier(d, BIG), release_fifo(fifo))
    assert t2.held_keys() == [good]
    assert not os.path.lexists(victim)  # the squatter is gone ...
    assert sorted(p.name for p in elsewhere.iterdir()) != []  # ... what it pointed to is not
    assert same_bits(t2.get([good])[0], gv)


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_fifo_swapped_in_under_an_indexed_object_is_a_miss(tmp_path: Path, kind: str) -> None:
    d = tmp_path / "nvme"
    tier = NvmeTier(d, BIG)
    k, v = make_key(1), make_payload(1)
    assert tier.put([(k, v)]) == [True]
    f = d / k.digest()
    f.unlink()
    fifo = f if kind == "fifo" else tmp_path / "fifo"
    os.mkfifo(fifo)
    if kind == "symlink":
        f.symlink_to(fifo)
    m = TieredStore([tier])
    assert finishes(lambda: m.get([k]), release_fifo(fifo)) == [None]
    assert m.where([k]) == [None]  # unreadable: forgotten
    m.close()


# ------------------------------------------------------------------ item 17: crafted headers
def _header(k: ObjectKey, **over: object) -> dict[str, object]:
    h: dict[str, object] = {"key": k.to_str(), "kind": k.kind.value, "shape": [64],
                            "dtype": "float32", "nbytes": 256, "stored": 256, "codec": "raw",
                            "checksum": codec.checksum(bytes(256))}
    h.update(over)
    return h


def _crafted_file(k: ObjectKey, damage: str) -> bytes:
    if damage == "nbytes_1e400":
        raw = codec.checksum(bytes(256)).encode()
        head = (b'{"key":"%s","kind":"kv","shape":[64],"dtype":"float32","nbytes":1e400,'
                b'"stored":256,"codec":"raw","checksum":"%s"}' % (k.to_str().encode(), raw))
        return crafted_blob(head, bytes(256))
    if damage == "nested_60k":
        return crafted_blob(b'{"key":' + b"[" * 60000, bytes(256))
    if damage == "negative_dims":
        return crafted_blob(_header(k, shape=[-8, -8]), bytes(256))
    if damage == "bool_and_float_dims":
        return crafted_blob(_header(k, shape=[True, 64.0], nbytes=256), bytes(256))
    if damage == "zstd_shape_of_1e12_bytes":
        frame = zstd_frame_claiming(10**12)
        return crafted_blob(_header(k, shape=[250_000_000_000], nbytes=10**12, codec="zstd",
                                    stored=len(frame)), frame)
    raise AssertionError(damage)


@pytest.mark.parametrize("damage", ["nbytes_1e400", "nested_60k", "negative_dims",
                                    "bool_and_float_dims", "zstd_shape_of_1e12_bytes"])
def test_crafted_header_is_dropped_at_start(tmp_path: Path, damage: str) -> None:
    d = tmp_path / "nvme"
    tier = NvmeTier(d, HUGE)
    good, gv = make_key(1), make_payload(1)
    assert tier.put([(good, gv)]) == [True]
    bad = make_key(2)
    (d / bad.digest()).write_bytes(_crafted_file(bad, damage))
    tier.close()  # a restart: one live store per directory
    t2 = NvmeTier(d, HUGE)  # starts (build_store must not fail on one bad file)
    assert t2.held_keys() == [good]
    assert bad.digest() in t2.dropped_at_start
    assert t2.get([bad]) == [None]
    assert sorted(p.name for p in d.iterdir() if p.name != LOCK_NAME) == [good.digest()]


@pytest.mark.parametrize("damage", ["stored_1e13", "frame_claims_1TB"])
def test_zstd_file_rewritten_with_absurd_sizes_is_a_miss(tmp_path: Path, damage: str) -> None:
    """The file under an indexed object is replaced by one whose (CRC-valid) header or
    zstd frame claims terabytes: the read is a miss, nothing that size is allocated."""
    d = tmp_path / "nvme"
    tier = NvmeTier(d, BIG, zstd={K.KV: 3})
    k, v = make_key(1), make_payload(1, (64,))
    assert tier.put([(k, v)]) == [True]
    frame = zstd_frame_claiming(10**12)
    stored = 10**13 if damage == "stored_1e13" else len(frame)
    (d / k.digest()).write_bytes(crafted_blob(_header(k, codec="zstd", stored=stored), frame))
    m = TieredStore([tier])
    assert m.get([k]) == [None]
    assert m.where([k]) == [None]
    m.close()


# ------------------------------------------------------------------ item 19: refused removals
@pytest.fixture
def ro_capable_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real tmpfs that the test can remount read-only (needs mount privileges)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount binary")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _remount(mnt: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], check=True)


@pytest.mark.timeout(30)
def test_remove_on_a_read_only_filesystem_reports_failure(ro_capable_tmpfs: Path) -> None:
    d = ro_capable_tmpfs / "nvme"
    two = {K.KV: 2 * 128}  # room for exactly the two objects below
    tier = NvmeTier(d, two)
    k1, v1 = make_key(1), make_payload(1)
    k2, v2 = make_key(2), make_payload(2)
    assert tier.put([(k1, v1), (k2, v2)]) == [True, True]
    _remount(ro_capable_tmpfs, "ro")
    try:
        assert tier.remove([k1]) == [False]  # honest: the file is still there
        assert tier.contains([k1]) == [True] and same_bits(tier.get([k1])[0], v1)
        assert list(tier.lru(K.KV)) == [k2]  # never offered as a victim again ...
        m = TieredStore([tier])
        more = [(make_key(i), make_payload(i)) for i in range(3, 6)]
        assert m.put(more) == [False] * 3  # ... so making room on a read-only tier ends
        m.close()  # and its tier: a restart (one live store per directory) ...
        t2 = NvmeTier(d, two)  # ... still finds what was never claimed gone
        assert set(t2.held_keys()) == {k1, k2}
    finally:
        _remount(ro_capable_tmpfs, "rw")
    assert t2.remove([k1]) == [True]
    t2.close()
    assert NvmeTier(d, BIG).held_keys() == [k2]


def test_removed_but_undeletable_file_does_not_come_back(tmp_path: Path) -> None:
    """An immutable file (chattr +i: even root cannot unlink it) is removed through a
    tombstone: gone now, still gone after a restart, and cleaned up once deletable."""
    d = tmp_path / "nvme"
    tier = NvmeTier(d, BIG)
    k1, v1 = make_key(1), make_payload(1)
    k2, v2 = make_key(2), make_payload(2)
    assert tier.put([(k1, v1), (k2, v2)]) == [True, True]
    f = d / k1.digest()
    if shutil.which("chattr") is None or subprocess.run(
            ["chattr", "+i", str(f)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here")
    try:
        assert tier.remove([k1]) == [True]
        assert f.exists()  # the filesystem refused ...
        assert tier.get([k1]) == [None] and tier.held_keys() == [k2]
        tier.close()  # restarts below: one live store per directory
        t2 = NvmeTier(d, BIG)  # ... yet a restart does not resurrect it
        assert t2.held_keys() == [k2]
        assert t2.put([(k1, torch.ones(3))]) == [False]  # cannot replace an immutable file
        t2.close()
        t2 = NvmeTier(d, BIG)
        assert t2.held_keys() == [k2]
        t2.close()
    finally:
        subprocess.run(["chattr", "-i", str(f)], check=False)
    t3 = NvmeTier(d, BIG)
    assert t3.held_keys() == [k2]
    # file and tombstone gone
    assert sorted(p.name for p in d.iterdir() if p.name != LOCK_NAME) == [k2.digest()]
    assert t3.put([(k1, v1)]) == [True]
    t3.close()
    assert same_bits(NvmeTier(d, BIG).get([k1])[0], v1)
