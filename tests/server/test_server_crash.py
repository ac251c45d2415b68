"""Our server killed (SIGKILL) while clients save, or stopped (SIGTERM) with clients
connected, then restarted over its NVMe directory (disk-only: every acknowledged save is
on NVMe, fsynced): every acknowledged save is served bit-exact, nothing torn is served,
SIGTERM exits 0 promptly."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from fault_support import (
    GEO,
    healthy,
    intact,
    loads_intact,
    payload,
    save_conversation,
    wait_for,
)
from raw_client import Raw, lm_key
from server_support import ServerProcess, client_config, server_config

from hybrid_connector.remote.client.server_cache import ServerCache


# ---------------------------------------------------------------- kill and restart
def disk_only(tmp: Path) -> dict[str, Any]:
    return server_config(tmp, host_mb=0, disk_mb=256, disk_fsync=True,
                         server={"http_port": None})


def saver(url: str, acked: list[int], tried: list[int], stop: threading.Event) -> None:
    """PUT then EXIST (the ack: a connection's frames are served in order) until the
    connection fails."""
    try:
        with Raw(url, timeout=5) as r:
            for i in range(10_000):
                if stop.is_set():
                    return
                tried.append(i)
                r.put(lm_key(i), payload(i, (16 << 10) * (1 + i % 8)))
                if r.exist(lm_key(i)):
                    acked.append(i)
    except OSError:
        return


def conversation(tag: int, extra: int = 0) -> np.ndarray:
    return np.random.default_rng(tag).integers(0, 1000, 600 + extra)


def hybrid_saver(url: str, acked: list[tuple[int, int]], stop: threading.Event) -> None:
    """Conversations saved through ``ServerCache``; acknowledged: the save returned and a
    lookup of the next turn hits (how many tokens)."""
    cache = ServerCache(client_config(url, chunk_size=256), GEO)
    try:
        for tag in range(1, 1000):
            if stop.is_set():
                return
            save_conversation(cache, conversation(tag), tag)
            hit = cache.lookup(conversation(tag, 64)).num_tokens
            if hit:
                acked.append((tag, hit))
    finally:
        cache.close()


def test_sigkill_while_saving_keeps_every_acknowledged_save(tmp_path: Path) -> None:
    proc = ServerProcess(disk_only(tmp_path), tmp_path).start()
    acked: list[int] = []
    tried: list[int] = []
    hybrid: list[tuple[int, int]] = []
    stop = threading.Event()
    try:
        threads = [threading.Thread(target=saver, args=(proc.url, acked, tried, stop)),
                   threading.Thread(target=hybrid_saver, args=(proc.url, hybrid, stop))]
        for t in threads:
            t.start()
        assert wait_for(lambda: len(acked) >= 30 and len(hybrid) >= 2, 40)
        proc.kill()  # SIGKILL mid-stream
        stop.set()
        for t in threads:
            t.join(30)
            assert not t.is_alive()
        proc.start()
        with Raw(proc.url) as r:
            for i in acked:
                got = r.get(lm_key(i))
                assert got == payload(i, (16 << 10) * (1 + i % 8)), i
            for i in tried[len(acked):]:  # in flight at the kill: absent or whole
                got = r.get(lm_key(i))
                assert got is None or got == payload(i, (16 << 10) * (1 + i % 8))
            for i in range(tried[-1] + 1, tried[-1] + 5):
                assert r.get(lm_key(i)) is None
        cache = ServerCache(client_config(proc.url, chunk_size=256), GEO)
        for tag, hit in hybrid:  # warm restart: the model's index adopts the NVMe objects
            assert loads_intact(cache, conversation(tag, 64), tag) == (hit, True), tag
        cache.close()
        healthy(proc.url)
    finally:
        stop.set()
        proc.kill()


def test_sigterm_exits_promptly_and_restart_serves_everything(tmp_path: Path) -> None:
    proc = ServerProcess(disk_only(tmp_path), tmp_path).start()
    try:
        with Raw(proc.url) as r:
            for i in range(40):
                r.put(lm_key(i), payload(i))
            assert all(r.exist(lm_key(i)) for i in range(40))
        cfg = client_config(proc.url, chunk_size=256)
        cache = ServerCache(cfg, GEO)  # an engine keeps idle connections open
        idle = Raw(proc.url)
        t0 = time.monotonic()
        assert proc.terminate(timeout=30) == 0
        took = time.monotonic() - t0
        idle.close()
        cache.close()
        assert took < 8.0, took
        proc.start()
        with Raw(proc.url) as r:
            assert all(r.get(lm_key(i)) == payload(i) for i in range(40))
            assert all(intact(r.get(lm_key(i)) or b"") for i in range(40))
    finally:
        proc.kill()
