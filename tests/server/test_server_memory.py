"""The server process's resident size stays bounded by its budgets: a real
``hybrid-connector server`` subprocess (its allocator settings, ``server.memory``, applied
as in production) under concurrent large PUTs and GETs from many connections, whose freed
buffers spread over every worker thread's glibc arena. Figures come from ``/proc``; the
deadline is generous (the trim runs every ``trim_interval_s``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from fault_support import payload, wait_for
from raw_client import Raw, lm_key
from server_support import ServerProcess, server_config

MiB = 1 << 20


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(ln for ln in f if ln.startswith("VmRSS:"))
    return int(line.split()[1]) << 10


def settled_rss(pid: int, within: float = 60.0) -> int:
    """The resident size once it stops growing (the host pool is faulted in after the
    server starts listening): under 2 MiB more in 1 s."""
    deadline, last = time.monotonic() + within, rss(pid)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = rss(pid)
        if abs(now - last) < 2 * MiB:
            return now
        last = now
    return last


def test_freed_buffers_do_not_keep_the_rss_above_the_budget(tmp_path: Path) -> None:
    """Recipe: 8 worker threads, ``max_inflight_bytes`` 96 MiB; four 24 MiB objects PUT
    one at a time, then 8 connections GET all four at once, three times over. Before, every arena kept its own
    peak of freed buffers (no trim), several hundred MiB over the budget once the load
    stopped. Now the freed pages go back once the resident size grew
    ``malloc_slack_bytes`` (32 MiB here): idle again, the server is within its idle size
    plus ``max_inflight_bytes`` plus the slack (plus 32 MiB for the interpreter's own
    growth)."""
    size, n, objects = 24 * MiB, 8, 4
    cfg = server_config(tmp_path, host_mb=320, server={
        "workers": 8, "max_inflight_bytes": "96MiB", "max_object_bytes": "32MiB",
        "max_frame_bytes": "64MiB", "idle_timeout_s": 60.0,
        "malloc_slack_bytes": "32MiB", "trim_interval_s": 0.5, "max_reply_bytes_per_peer": "96MiB"})
    errors: list[BaseException] = []

    one_put = threading.Lock()  # concurrent PUTs above the budget wait for room to the
    # deadline: each body holds the room of what it has read (out of this test's scope)

    def client(i: int, start: threading.Barrier) -> None:
        try:
            with Raw(url, timeout=60.0) as r:
                if i < objects:
                    with one_put:
                        r.put(lm_key(i), payload(i, size))
                        assert r.exist(lm_key(i))
                start.wait(120)
                for _ in range(3):
                    for j in range(objects):
                        k = (i + j) % objects
                        assert r.get(lm_key(k)) == payload(k, size)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
            start.abort()

    with ServerProcess(cfg, tmp_path) as server:
        assert server.proc is not None
        pid, url = server.proc.pid, server.url
        idle = settled_rss(pid)
        start = threading.Barrier(n)
        threads = [threading.Thread(target=client, args=(i, start)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors
        assert not any(t.is_alive() for t in threads)
        bound = idle + 96 * MiB + 32 * MiB + 32 * MiB
        assert wait_for(lambda: rss(pid) <= bound, 20), (rss(pid) // MiB, idle // MiB)
        assert server.terminate() == 0
