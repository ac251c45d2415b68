"""``Guard``: runs remote calls so that a failing server costs one failure, not one per call.

Any exception out of a call is a failure: it marks the remote down for a backoff period
(``min_backoff`` doubling up to ``max_backoff``), during which ``run`` answers at once
without calling (no network). One WARNING is logged when it goes down and one INFO when a
call succeeds again. Thread safe; the lock is never held during a call.

An exception of a ``partial`` type (a cluster shard down: the rest of the store is fine)
is a failed call too, counted, but marks nothing down: the client keeps its own backoff
for the part that failed (``hybrid_connector.tiers.remote.cluster``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Guard:
    """Backoff state of one remote (``what`` names it in logs, e.g. ``"remote (url)"``);
    ``on_failure`` runs after each failed call (e.g. to count it)."""

    def __init__(self, log: logging.Logger, what: str, min_backoff: float, max_backoff: float,
                 on_failure: Callable[[], None] | None = None,
                 partial: tuple[type[Exception], ...] = ()) -> None:
        self.log, self.what, self.partial = log, what, partial
        self.min_backoff, self.max_backoff = min_backoff, max_backoff
        self.on_failure = on_failure
        self.failures = 0
        self._backoff = min_backoff
        self._down_until = 0.0
        self._down = False
        self._lock = threading.Lock()

    @property
    def is_down(self) -> bool:
        """Within a backoff period (calls are answered without the network)."""
        return self._down and time.monotonic() < self._down_until

    def run(self, call: str, fn: Callable[[], T]) -> tuple[bool, T | None]:
        """(True, ``fn()``), or (False, None) when ``fn`` raised or the remote is down."""
        with self._lock:
            if self._down and time.monotonic() < self._down_until:
                return False, None
        try:
            out = fn()
        except Exception as exc:  # every remote failure is a miss, whatever raised it
            with self._lock:
                self.failures += 1
                if not isinstance(exc, self.partial):  # a part: its client backs off from it
                    if not self._down:
                        self.log.warning("%s down: %s failed: %s; treating as misses, "
                                         "retrying with backoff", self.what, call, exc)
                    self._down_until = time.monotonic() + self._backoff
                    self._backoff = min(self._backoff * 2, self.max_backoff)
                    self._down = True
            if self.on_failure is not None:
                self.on_failure()
            return False, None
        with self._lock:
            if self._down:
                self.log.info("%s is back", self.what)
            self._down = False
            self._backoff = self.min_backoff
        return True, out
