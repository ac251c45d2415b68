"""Kill a writer mid-flight, the way a crash would: shared by the SIGKILL tests."""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable


def fork_and_kill(child: Callable[[int], None], delay: float,
                  from_first_report: bool = False) -> bytes:
    """Fork; the child runs ``child(wfd)`` (it reports progress by writing lines to ``wfd``)
    and is SIGKILLed after ``delay`` seconds, counted from the fork or, with
    ``from_first_report``, from its first report (so a slow start on a loaded machine does
    not eat the time it has to work; at most 60 s are waited for that report). Returns every
    byte it wrote, a torn last line included (callers drop it)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(rfd)
        try:
            child(wfd)
        finally:
            os._exit(1)
    os.close(wfd)
    buf = b""
    deadline = time.monotonic() + (60.0 if from_first_report else delay)
    while (left := deadline - time.monotonic()) > 0:
        if select.select([rfd], [], [], left)[0]:
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            if from_first_report and not buf:
                deadline = time.monotonic() + delay
            buf += chunk
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    while chunk := os.read(rfd, 65536):  # lines written before the kill
        buf += chunk
    os.close(rfd)
    return buf
