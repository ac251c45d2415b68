"""Start and stop real servers (lmcache_server, redis-server) on 127.0.0.1 for tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
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


def hang(pid: int, timeout: float = 60.0) -> None:
    """SIGSTOP ``pid`` and return once every one of its threads is stopped (state ``T``
    in ``/proc/<pid>/task/*/stat``). ``kill`` returns once the signal is pending: one thread
    is woken to start the group stop, and until it is scheduled (seconds on a loaded host)
    the others still run and may answer a request sent meanwhile."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:  # the state follows the parenthesised command name, which may hold spaces
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread that exited meanwhile
        if states and all(st in ("T", "t") for st in states):
            return
        assert time.monotonic() < deadline, f"pid {pid} not stopped within {timeout}s: {states}"
        time.sleep(0.01)


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



def lmcache_binary() -> str:
    """Path of ``lmcache_server``; skips (fails under CI=true) when it is missing."""
    binary = _lmcache_bin()
    if binary is None:
        _missing("lmcache_server")
    assert binary is not None
    return binary


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        _missing("redis-server")
    assert binary is not None
    return binary


@contextmanager
def run_lmcache(workdir: Path) -> Iterator[str]:
    """A real ``lmcache_server`` (CPU storage) on a free port; yields ``lm://...``."""
    binary = lmcache_binary()
    port = free_port()
    log = workdir / "lmcache.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([binary, "127.0.0.1", str(port), "cpu"], stdout=fh,
                                stderr=subprocess.STDOUT)
    try:
        _wait_port(port, proc, 60.0, log)
        yield f"lm://127.0.0.1:{port}"
    finally:
        _stop(proc)


@contextmanager
def run_redis(workdir: Path) -> Iterator[str]:
    """A real, non-persistent ``redis-server`` on a free port; yields ``redis://...``."""
    binary = redis_binary()
    port = free_port()
    log = workdir / "redis.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no", "--dir", str(workdir)],
                                stdout=fh, stderr=subprocess.STDOUT)
    try:
        _wait_port(port, proc, 20.0, log)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop(proc)


class StalledServer:
    """A real socket that accepts connections and never answers; ``accepted`` counts the
    connections it took, so a test can tell whether a call touched the network."""

    def __init__(self) -> None:
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(16)
        self.addr = f"127.0.0.1:{self.srv.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def accepted(self) -> int:
        return len(self.conns)

    def _accept(self) -> None:
        self.srv.settimeout(0.05)
        while not self.stop.is_set():
            try:
                c, _ = self.srv.accept()
                self.conns.append(c)  # keep it open, read nothing, answer nothing
            except OSError:
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        for c in self.conns:
            c.close()
        self.srv.close()
