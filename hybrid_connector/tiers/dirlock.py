"""An exclusive, crash-safe claim on a directory for one store's lifetime.

``DirLock(path)`` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``path/.hybrid-connector.lock``
and records the holder's pid in it. A second claim on the same directory fails at once with
``DirectoryLocked`` naming the path and that pid, whether it comes from another process or
from this one (flock locks belong to an open file description, so two opens in one process
conflict too). ``release`` (or the holder's death, SIGKILL included: the kernel drops the
lock with the last descriptor) frees the directory; the file itself stays, since deleting
it would let two openers lock two different inodes. The descriptor is close-on-exec; a
child forked while the lock is held shares it until it exits or closes it. flock is
advisory and node-local: on NFS it may not exclude another host. On a read-only filesystem
the pid cannot be recorded, and a directory that never had a lock file is opened unlocked
(nobody can delete anything there).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

LOCK_NAME = ".hybrid-connector.lock"


class DirectoryLocked(OSError):
    """The directory already belongs to a live store (the message names it and the pid)."""


class DirLock:
    """Holds the lock on ``path`` (an existing directory) until ``release``; see the module
    docstring. Raises ``DirectoryLocked`` when another holder has it, OSError when the lock
    file cannot be opened."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.file = self.path / LOCK_NAME
        self._fd: int | None = None
        try:
            os.close(os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno != errno.EROFS or self.file.exists():
                raise
            return  # read-only and never locked: see the module docstring
        # Held read-only: a descriptor open for writing would make `mount -o remount,ro`
        # of the disk fail (busy), so the pid goes in through a short-lived one below.
        fd = os.open(self.file, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").split()
            os.close(fd)
            pid = holder[0] if holder else "unknown"
            raise DirectoryLocked(
                f"{self.path} is in use by another store (pid {pid}, lock file {self.file}); "
                "one directory serves one store at a time: give each its own directory"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        record = f"{os.getpid()}\n".encode()
        with contextlib.suppress(OSError):  # a read-only filesystem: locked, pid unrecorded
            wfd = os.open(self.file, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.pwrite(wfd, record, 0)  # then cut: a reader never sees an empty file
                os.ftruncate(wfd, len(record))
            finally:
                os.close(wfd)

    def release(self) -> None:
        """Give the directory up (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor drops the flock

    def __del__(self) -> None:  # an unreleased store that was collected frees its directory
        with contextlib.suppress(Exception):
            self.release()
