"""Small file helpers of the NVMe tier: vectored writes, exact reads, opens that refuse
anything but a regular file without blocking, and removal tombstones.

A tombstone records the identity ``(st_ino, st_size, st_mtime_ns)`` of an object file that
was removed but could not be deleted, so a restart can tell that exact file from a newer
one stored under the same name later.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tiers import codec


def write_all(fd: int, *parts: codec.Buf) -> None:
    """Write every part, in order, with as few syscalls as the kernel allows (writev)."""
    views = [memoryview(p).cast("B") for p in parts]
    views = [v for v in views if len(v)]
    while views:
        n = os.writev(fd, views)
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def write_file(path: Path, fsync: bool, *parts: codec.Buf) -> None:
    """Create ``path`` (it must not exist), write ``parts`` and, with ``fsync``, make the
    bytes durable before returning. OSError on failure (``path`` may then remain)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd, *parts)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_checked(fd: int, dst: memoryview, offset: int, hasher: codec.Hasher | None,
                 chunk: int = 1 << 18) -> None:
    """Read ``len(dst)`` bytes at ``offset`` straight into ``dst``, feeding each chunk to
    ``hasher`` while it is still in cache (one pass over memory, not two; 256 KiB stays in
    L2). CorruptObject if the file is shorter."""
    off = 0
    while off < len(dst):
        n = os.preadv(fd, [dst[off : off + chunk]], offset + off)
        if n <= 0:
            raise codec.CorruptObject("file shorter than its header says")
        if hasher is not None:
            hasher.update(dst[off : off + n])
        off += n


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """(fd, fstat) of ``path`` opened for reading, refusing anything but a regular file
    without ever blocking: O_NOFOLLOW refuses a symlink (ELOOP), O_NONBLOCK lets the open
    of a FIFO return at once instead of waiting for a writer, and fstat then refuses a
    FIFO, device or directory (CorruptObject). The fd is blocking again on return."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise codec.CorruptObject(f"not a regular file (mode {st.st_mode:o})")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_exact(fd: int, buf: memoryview, offset: int) -> None:
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], offset + got)
        if n <= 0:
            raise codec.CorruptObject("file shorter than its header says")
        got += n


def write_tombstone(tomb: Path, tmp: Path, st: os.stat_result, fsync: bool) -> None:
    """Atomically write ``tomb`` (via ``tmp``) recording the file identity ``st``; with
    ``fsync`` it is durable on return. OSError on failure (``tmp`` may then remain)."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd, f"{st.st_ino} {st.st_size} {st.st_mtime_ns}\n".encode())
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, tomb)
    if fsync:
        dfd = os.open(tomb.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def read_tombstone(tomb: Path) -> tuple[int, int, int]:
    """The ``(st_ino, st_size, st_mtime_ns)`` a tombstone records; OSError or ValueError
    if it is unreadable or malformed."""
    try:
        fd, _ = open_regular(tomb)
    except codec.CorruptObject as exc:
        raise ValueError(str(exc)) from exc
    try:
        ino, size, mtime = (int(x) for x in os.pread(fd, 100, 0).split())
    finally:
        os.close(fd)
    return ino, size, mtime
