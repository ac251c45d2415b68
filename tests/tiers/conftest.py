"""Fixtures for the tier tests: keys, payloads, and real servers on 127.0.0.1.

``lmcache_server`` and ``redis_server`` start the real binaries on a free port and tear
them down. A missing binary skips the test, except with ``CI=true`` where it fails (so CI
can never pass by silently skipping the integration tests).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


def _missing(what: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} is missing and CI=true (run scripts/install_servers.sh)")
    pytest.skip(f"{what} is missing (run scripts/install_servers.sh)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not listen on {port} within {timeout}s: {log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _lmcache_bin() -> str | None:
    cand = Path(sys.executable).parent / "lmcache_server"
    return str(cand) if cand.exists() else shutil.which("lmcache_server")


@pytest.fixture(scope="session")
def lmcache_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``lm://127.0.0.1:PORT`` of a real ``lmcache_server`` (lmcache 0.5.6, CPU storage)."""
    binary = _lmcache_bin()
    if binary is None:
        _missing("lmcache_server")
    assert binary is not None
    port = free_port()
    log = tmp_path_factory.mktemp("lmcache") / "server.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([binary, "127.0.0.1", str(port), "cpu"], stdout=fh,
                                stderr=subprocess.STDOUT)
    try:
        _wait_port(port, proc, 60.0, log)
        yield f"lm://127.0.0.1:{port}"
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``redis://127.0.0.1:PORT/0`` of a real, non-persistent ``redis-server``."""
    binary = shutil.which("redis-server")
    if binary is None:
        _missing("redis-server")
    assert binary is not None
    port = free_port()
    d = tmp_path_factory.mktemp("redis")
    log = d / "server.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no", "--dir", str(d)],
                                stdout=fh, stderr=subprocess.STDOUT)
    try:
        _wait_port(port, proc, 20.0, log)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop(proc)


@pytest.fixture
def stalled_server() -> Iterator[str]:
    """``host:port`` of a real socket that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    conns: list[socket.socket] = []
    import threading

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
