"""The two extremes of how fast a worker's tier threads run, for tests whose results must
not depend on it: every op batch run in the thread that submits it, or every op batch held
on its lanes until someone calls ``Executor.flush`` (or ``hold_s`` passes, so a run that
never flushes still ends)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from hybrid_connector.tiers.executor import Executor


def immediate(mp: pytest.MonkeyPatch) -> None:
    """Every op batch runs in the thread that submits it (the fastest lanes possible)."""
    submit = Executor.submit

    def inline_submit(self: Executor, *a: Any, **kw: Any) -> Any:
        was, self.inline = self.inline, True
        try:
            return submit(self, *a, **kw)
        finally:
            self.inline = was

    mp.setattr(Executor, "submit", inline_submit)


def held(mp: pytest.MonkeyPatch, go: threading.Event, hold_s: float = 60.0) -> None:
    """Every op batch waits on its lanes until ``flush`` is called or ``hold_s`` passed:
    the slowest lanes a run can wait for."""
    submit, flush = Executor.submit, Executor.flush

    def held_submit(self: Executor, *a: Any, **kw: Any) -> Any:
        if not self.inline:
            for lane in self._lanes.values():
                lane.submit(go.wait, hold_s)
        return submit(self, *a, **kw)

    def releasing_flush(self: Executor, timeout: float | None = None) -> None:
        go.set()
        try:
            flush(self, timeout)
        finally:
            go.clear()

    mp.setattr(Executor, "submit", held_submit)
    mp.setattr(Executor, "flush", releasing_flush)
