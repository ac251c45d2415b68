"""The server process keeps the memory it frees for reuse, up to a bound.

glibc serves large allocations (every frame body, every object read) with fresh ``mmap``
pages and unmaps them on free, so each one faults every page in again: measured here, that
doubled the CPU per byte of a GET (0.53 vs 0.22 ms/MB) and of receiving a frame. The
server raises ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` so such buffers come from the
heap and freed pages stay mapped (``keep_freed_memory``). Left alone, that keeps each
glibc arena (one per worker thread, one for the event loop) at its own peak, and their sum
exceeds ``max_inflight_bytes``. ``Trimmer`` bounds it: every ``trim_interval_s`` it reads
the resident size and, once it is ``malloc_slack_bytes`` above the process's own memory
plus the bytes in flight, returns the arenas' free pages (``malloc_trim(0)``, off the
event loop), so the resident size stays within the in-use bytes (host pools,
``max_inflight_bytes``, the unauthenticated budget) plus the slack plus what grew within
one interval, and a steady load that reuses its buffers rarely pays the page faults. Not glibc (musl, macOS): nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from typing import Any

log = logging.getLogger(__name__)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 1 << 30  # glibc's maximum for this knob on 64-bit is larger; 1 GiB is the frame cap
TRIM_THRESHOLD = 8 << 30


def _libc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Apply the two ``mallopt`` settings; False where glibc's ``mallopt`` is missing."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not ok:
        log.info("mallopt refused the server's allocation settings; using the defaults")
    return ok


def resident_bytes() -> int:
    """This process's resident size (``/proc/self/statm``; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Trimmer:
    """Freed heap memory goes back to the system once the resident size is more than
    ``slack`` bytes above what is in use: the process's own memory (``base``: its resident
    size at start, pools faulted in) plus the bytes in flight the caller counts. Trimming
    only then keeps a steady load's buffers faulted in (a trim makes the next use of each
    freed page fault again). What a trim cannot return is the process's own growth
    (indexes, names): ``base`` rises to it, so it is not trimmed again for nothing.
    ``available``: False off glibc or without ``/proc`` (``due`` is always False then).
    ``trims``: how many times it trimmed; ``freed``: bytes the last trim gave back."""

    def __init__(self, slack: int) -> None:
        self.slack = slack
        self._trim: Any = getattr(_libc(), "malloc_trim", None)
        self.base = resident_bytes()
        self.available = self._trim is not None and self.base > 0
        self.trims = self.freed = 0

    def due(self, in_use: int) -> bool:
        return self.available and resident_bytes() > self.base + in_use + self.slack

    def trim(self, in_use: int) -> None:
        """``malloc_trim(0)`` over every arena (milliseconds to a second for a large heap:
        call it off the event loop); ``in_use``: the bytes in flight now."""
        if self.available:
            before = resident_bytes()
            self._trim(0)
            after = resident_bytes()
            self.base = max(self.base, after - in_use)
            self.trims += 1
            self.freed = max(0, before - after)
