"""Shard bookkeeping of the cluster client (``tiers.remote_cluster``): which shards are
backed off, topology refreshes, and per-shard batches run side by side.

* ``Shards.mark_down``/``mark_up``/``backing_off``: a shard that failed is backed off for
  ``min_backoff`` doubling to ``max_backoff`` seconds (one WARNING when it goes down, one
  INFO when it is back).
* ``Shards.refresh``: re-reads the slot map on a thread of its own, under a deadline of its
  own, at most one at a time and one per ``refresh_interval`` unless forced, so no call
  waits for it or spends its deadline on it.
* ``Shards.each``: one job per shard, concurrently, each under what is left of the calling
  thread's deadline, so a hung shard spends its own share and not the others'.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, TypeVar

from tiers import deadline
from tiers.remote_clients import ShardUnavailable

log = logging.getLogger("tiers.remote_cluster")
T = TypeVar("T")


def op(method: str, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
    """A command of a redis-py client (or pipeline), bound to its arguments."""
    return lambda r: getattr(r, method)(*args, **kwargs)


def patch_slot(rc: Any, moved: Exception) -> None:
    """Point the slot map at a MOVED redirect's node (redis-py >= 6 patches at once, 5.x
    at the next look-up)."""
    nm = rc.nodes_manager
    move = getattr(nm, "move_slot", None)
    if move is not None:
        move(moved)
    else:
        nm.update_moved_exception(moved)


class Shards:
    """The shards' state of one cluster client (``url`` names it in logs)."""

    def __init__(self, url: str, timeout: float, min_backoff: float, max_backoff: float,
                 refresh_interval: float) -> None:
        self.url, self.timeout = url, timeout
        self.min_backoff, self.max_backoff = min_backoff, max_backoff
        self.refresh_interval = refresh_interval
        self._lock = threading.Lock()  # guards _down and _pool
        self._down: dict[str, tuple[float, float]] = {}  # node name -> (until, backoff)
        self._refresh_lock = threading.Lock()
        self._last_refresh = 0.0
        self._pool: ThreadPoolExecutor | None = None

    def refresh(self, rc: Any, force: bool = False, avoid: str | None = None) -> None:
        """Re-read the slot map on a thread of its own (under a deadline of its own), at
        most one at a time and one per ``refresh_interval`` unless ``force``: no call
        waits for it or spends its deadline on it (a hung node could eat all of it). The
        ``avoid`` node (a shard found down) is asked last, where redis-py allows it."""
        now = time.monotonic()
        if not force and now - self._last_refresh < self.refresh_interval:
            return
        if not self._refresh_lock.acquire(blocking=False):
            return
        self._last_refresh = now

        def run() -> None:
            try:
                with deadline.scope(self.timeout):
                    try:
                        rc.nodes_manager.initialize(last_failed_node_name=avoid)
                    except TypeError:  # redis-py < 7: no such argument
                        rc.nodes_manager.initialize()
            except Exception as exc:  # no node answered in time: the old map stays
                log.debug("remote cluster %s: topology refresh failed: %s", self.url, exc)
            finally:
                self._refresh_lock.release()
        threading.Thread(target=run, name="remote-cluster-refresh", daemon=True).start()

    def mark_down(self, node: str, exc: BaseException) -> None:
        with self._lock:
            _, backoff = self._down.get(node, (0.0, self.min_backoff / 2))
            backoff = min(backoff * 2, self.max_backoff)
            if node not in self._down:
                log.warning("remote cluster %s: shard %s down: %s; its keys are misses, "
                            "retrying with backoff", self.url, node, exc)
            self._down[node] = (time.monotonic() + backoff, backoff)

    def mark_up(self, node: str) -> None:
        if node in self._down:  # racy read: a miss here only delays the INFO
            with self._lock:
                if self._down.pop(node, None) is not None:
                    log.info("remote cluster %s: shard %s is back", self.url, node)

    def backing_off(self, node: str) -> bool:
        with self._lock:
            until = self._down.get(node, (0.0, 0.0))[0]
        return time.monotonic() < until

    def each(self, jobs: list[T], fn: Callable[[T], None]) -> list[BaseException | None]:
        """``fn(job)`` for each job (one per shard), concurrently when there are several,
        each under what is left of this call's deadline: a hung shard spends its own
        share, not the others'. The exception each raised, or None."""
        if len(jobs) <= 1:
            out: list[BaseException | None] = []
            for j in jobs:
                try:
                    fn(j)
                    out.append(None)
                except Exception as exc:
                    out.append(exc)
            return out
        left = deadline.left()
        at = time.monotonic() + (self.timeout if left is None else left)

        def run(j: T) -> None:
            with deadline.scope(max(at - time.monotonic(), 1e-3)):
                fn(j)
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(8, thread_name_prefix="remote-cluster")
            pool = self._pool
        futs = [pool.submit(run, j) for j in jobs]
        done, _ = wait(futs, timeout=max(at - time.monotonic(), 0.0) + 0.05)
        return [f.exception() if f in done else ShardUnavailable("no answer within the deadline")
                for f in futs]

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
