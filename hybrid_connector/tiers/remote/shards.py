"""Shard bookkeeping of the cluster client (``hybrid_connector.tiers.remote.cluster``): which shards are
backed off, topology refreshes, and per-shard batches run side by side.

* ``Shards.mark_down``/``mark_up``/``backing_off``: a shard that failed is backed off for
  ``min_backoff`` doubling to ``max_backoff`` seconds (one WARNING when it goes down, one
  INFO when it is back).
* ``Shards.refresh``: re-reads the slot map on a thread of its own, under a deadline of its
  own, at most one at a time and one per ``refresh_interval`` unless forced, so no call
  waits for it or spends its deadline on it.
* ``Shards.each``: one job per shard, concurrently, each under what is left of the calling
  thread's deadline, so a hung shard spends its own share and not the others'.
* ``answering_first``/``cluster_via``: discovery through a node that answers, so a hung node
  (a stopped master) never spends a new client's first call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from hybrid_connector.tiers import deadline
from hybrid_connector.tiers.remote.clients import ShardUnavailable

log = logging.getLogger("hybrid_connector.tiers.remote.cluster")
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

    def each(self, jobs: list[T], fn: Callable[[T], None],
             until_one: bool = False) -> list[BaseException | None]:
        """``fn(job)`` for each job (one per shard), concurrently when there are several,
        each under what is left of this call's deadline: a hung shard spends its own
        share, not the others'. The exception each raised, or None. ``until_one``: return
        as soon as one job succeeded (the jobs still running then count as
        ShardUnavailable, and end by the deadline)."""
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
        done, pending = wait(futs, timeout=max(at - time.monotonic(), 0.0) + 0.05,
                             return_when=FIRST_COMPLETED if until_one else ALL_COMPLETED)
        while until_one and pending and not any(f.exception() is None for f in done):
            more, pending = wait(pending, timeout=max(at - time.monotonic(), 0.0) + 0.05,
                                 return_when=FIRST_COMPLETED)
            if not more:
                break
            done |= more
        return [f.exception() if f in done else ShardUnavailable("no answer within the deadline")
                for f in futs]

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)


def answering_first(nodes: Sequence[tuple[str, int]], timeout: float) -> list[tuple[str, int]]:
    """The first of ``nodes`` to answer a PING, alone (all asked in parallel, waiting at
    most ``timeout`` for one answer), or all of them in their given order when none did."""
    import redis

    answered: list[tuple[str, int]] = []
    first = threading.Event()
    lock = threading.Lock()

    def ping(node: tuple[str, int]) -> None:
        r = redis.Redis(node[0], node[1], socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            r.ping()
        except Exception:  # unreachable, hung, refusing: not the lead
            return
        finally:
            r.close()
        with lock:
            answered.append(node)
        first.set()

    for n in nodes:
        threading.Thread(target=ping, args=(n,), daemon=True, name="hc-cluster-ping").start()
    first.wait(timeout)
    with lock:
        lead = answered[:1]
    return lead or list(nodes)


def cluster_via(nodes: Sequence[tuple[str, int]], **kwargs: Any) -> Any:
    """redis-py's ``RedisCluster`` discovered through ``nodes[0]`` (the node that answered,
    see ``answering_first``; a URL of it makes redis-py build every node's pool with
    ``kwargs["connection_class"]``), the rest startup nodes too. redis-py 8 shuffles its
    startup nodes, and sends the COMMAND its constructor asks to its default node, the
    master of slot 0: either may be a hung node, which would spend the whole deadline. So
    ``nodes[0]`` is the only startup node when it is the only one given, and it answers
    that COMMAND (also when the slot map leaves it out, as a replica of a hung master);
    redis-py learns the other nodes from its slot map."""
    from redis.cluster import ClusterNode, RedisCluster

    (h0, p0), *others = nodes
    lead = ClusterNode(h0, p0)

    class _Cluster(RedisCluster):
        _lead: ClusterNode | None = lead

        def get_default_node(self) -> Any:
            if self._lead is None:
                return super().get_default_node()
            if self._lead.redis_connection is None:  # its pool, as redis-py builds one
                self.nodes_manager.create_redis_connections([self._lead])
            return self._lead

    rc = _Cluster(url=f"redis://{f'[{h0}]' if ':' in h0 else h0}:{p0}",
                  startup_nodes=[ClusterNode(h, p) for h, p in others], **kwargs)
    rc._lead = None  # built: redis-py's default node again (we send no keyless command)
    if lead.redis_connection is not None:
        lead.redis_connection.close()
    return rc
