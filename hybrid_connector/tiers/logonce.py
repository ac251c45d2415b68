"""Log a failure class once at WARNING, then quietly count repeats (no log floods)."""

from __future__ import annotations

import logging
import threading
from collections import Counter


class LogOnce:
    """``warn(reason, msg, *args)`` logs the first time ``reason`` is seen (and again after
    ``reset(reason)``, e.g. when a remote came back), else only at DEBUG."""

    def __init__(self, logger: logging.Logger) -> None:
        self.log = logger
        self.seen: Counter[str] = Counter()
        self._lock = threading.Lock()

    def warn(self, reason: str, msg: str, *args: object) -> None:
        with self._lock:
            first = self.seen[reason] == 0
            self.seen[reason] += 1
        if first:
            self.log.warning(msg, *args)
        else:
            self.log.debug(msg, *args)

    def reset(self, reason: str) -> None:
        with self._lock:
            self.seen.pop(reason, None)
