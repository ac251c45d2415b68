"""Fixtures for the tier tests: keys, payloads, and real servers on 127.0.0.1.

``lmcache_server`` and ``redis_server`` start the real binaries on a free port and tear
them down. A missing binary skips the test, except with ``CI=true`` where it fails (so CI
can never pass by silently skipping the integration tests).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from tier_servers import free_port, run_lmcache, run_redis


@pytest.fixture(scope="session")
def lmcache_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``lm://127.0.0.1:PORT`` of a real ``lmcache_server`` (lmcache 0.5.6, CPU storage)."""
    with run_lmcache(tmp_path_factory.mktemp("lmcache")) as url:
        yield url


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis://127.0.0.1:PORT/0`` of a real, non-persistent ``redis-server``."""
    with run_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def stalled_server() -> Iterator[str]:
    """``host:port`` of a real socket that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
                conns.append(c)  # keep it open, read nothing, answer nothing
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(2)
        for c in conns:
            c.close()
        srv.close()


@pytest.fixture
def dead_port() -> int:
    """A port nobody listens on (connection refused)."""
    return free_port()
