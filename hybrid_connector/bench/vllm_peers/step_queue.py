"""The order of vLLM's engine steps, shared by the head-to-head's driver, the test harness
and the scheduler-cost benchmark, so all drive vLLM's scheduler as its ``EngineCore`` does:
synchronously (schedule a step, run it, process its output), or under async scheduling
with the batch queue of two of ``EngineCore.step_with_batch_queue`` (step t+1 is scheduled
and run before step t's output is processed)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any


class StepQueue:
    """Steps scheduled and run whose output is not processed yet (at most one, two with
    ``pipelined``). ``runner.step(scheduler_output)`` runs a step and returns its
    ``ModelRunnerOutput``."""

    def __init__(self, sched: Any, runner: Any, pipelined: bool = False) -> None:
        self.sched = sched
        self.runner = runner
        self.pipelined = pipelined
        self._q: deque[tuple[Any, Any]] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def step(self, schedule: Callable[[], Any] | None = None) -> tuple[Any, Any] | None:
        """One turn of the engine loop: when vLLM has requests, schedule a step
        (``schedule``: how, default ``sched.schedule``) and run it; then the oldest step
        whose output is due, ``(scheduler output, model runner output)`` for
        ``update_from_output``. None while the batch queue fills (``len`` > 0) or when
        nothing was scheduled nor is in flight (``len`` == 0)."""
        if self.sched.has_requests():
            so = (schedule or self.sched.schedule)()
            self._q.appendleft((so, self.runner.step(so)))
            if self.pipelined and len(self._q) < 2:
                return None
        return self._q.pop() if self._q else None

    def drain(self) -> Iterator[tuple[Any, Any]]:
        """The steps still in flight, oldest first (their outputs are due now)."""
        while self._q:
            yield self._q.pop()
