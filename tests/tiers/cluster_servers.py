"""A real Redis Cluster on 127.0.0.1 for tests and benchmarks: ``redis-server
--cluster-enabled yes`` on free ports (3 masters + 3 replicas by default), joined with
``redis-cli --cluster create``, ready once every node reports ``cluster_state:ok`` and
agrees on the slot map. Every process is killed on exit, also when start-up fails.

``cluster-require-full-coverage no`` (as docs/scale-out.md recommends for a cache): while one
shard is down the others keep answering for their slots.
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tier_servers import _missing, _stop, _wait_port, hang


def cluster_binaries() -> tuple[str, str]:
    """``redis-server`` and ``redis-cli``; skips (fails under CI=true) when missing."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        _missing("redis-server/redis-cli")
    assert server is not None and cli is not None
    return server, cli


@dataclass
class Cluster:
    """A running cluster: ``url`` is ``redis+cluster://`` of every node."""

    workdir: Path
    cli: str
    ports: list[int]
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    stopped: set[int] = field(default_factory=set)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def cli_call(self, port: int, *args: str, timeout: float = 30.0) -> str:
        # generous: a command answers at once on an idle node; a busy CI machine only delays it
        r = subprocess.run([self.cli, "-h", "127.0.0.1", "-p", str(port), *args],
                           capture_output=True, timeout=timeout, check=False)
        return r.stdout.decode(errors="replace")

    def alive(self) -> list[int]:
        """Ports of the nodes running (neither killed nor stopped)."""
        return [p for p, proc in self.procs.items() if proc.poll() is None and p not in self.stopped]

    def nodes(self, port: int) -> list[list[str]]:
        """``CLUSTER NODES`` as seen by ``port``, one split line per node."""
        return [ln.split() for ln in self.cli_call(port, "cluster", "nodes").splitlines() if ln]

    def masters(self) -> dict[int, list[tuple[int, int]]]:
        """Live master port -> its slot ranges, as the first live node sees it."""
        out: dict[int, list[tuple[int, int]]] = {}
        for n in self.nodes(self.alive()[0]):
            if "master" in n[2] and "fail" not in n[2] and len(n) > 8:
                port = int(n[1].split("@")[0].rsplit(":", 1)[1])
                ranges = [tuple(int(x) for x in s.split("-")) if "-" in s else (int(s), int(s))
                          for s in n[8:] if not s.startswith("[")]
                out[port] = [(a, b) for a, b in ranges]
        return out

    def master_of_slot(self, slot: int) -> int:
        for port, ranges in self.masters().items():
            if any(a <= slot <= b for a, b in ranges):
                return port
        raise LookupError(f"slot {slot} is not served")

    def kill(self, port: int) -> None:
        """SIGKILL one node (a crash: no goodbye to the others)."""
        proc = self.procs[port]
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)

    def stop(self, port: int) -> None:
        """SIGSTOP one node: it hangs with its sockets open (accepts, never answers), as a
        node that stalls or sits behind a dropped link. Returns once it is stopped."""
        hang(self.procs[port].pid)
        self.stopped.add(port)

    def ok(self, ports: list[int] | None = None) -> bool:
        """Every live node (or ``ports``) reports ``cluster_state:ok`` and all 16384 slots
        served by masters they agree on."""
        views = []
        for p in ports or self.alive():
            info = self.cli_call(p, "cluster", "info")
            if "cluster_state:ok" not in info or "cluster_slots_ok:16384" not in info:
                return False
            views.append(sorted((ln[1].split("@")[0], " ".join(ln[8:])) for ln in self.nodes(p)
                                if "master" in ln[2] and "fail" not in ln[2] and len(ln) > 8))
        return all(v == views[0] for v in views)

    def wait_ok(self, timeout: float = 30.0) -> float:
        """Seconds until ``ok``; RuntimeError past ``timeout``."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.ok():
                return time.monotonic() - t0
            time.sleep(0.1)
        raise RuntimeError(f"cluster not ok within {timeout}s: {self.cli_call(self.alive()[0], 'cluster', 'info')}")


def _free_bus_pair() -> int:
    """A port p with p and its cluster bus p + 10000 both free, both below the kernel's
    ephemeral range: a free port from that range could have its bus port taken meanwhile
    by any outgoing connection (a clean-clone CI run lost a node to exactly that)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    top = min(low, 65536) - 10000
    rng = random.Random()
    for _ in range(1000):
        p = rng.randrange(1024, top)
        socks = [socket.socket() for _ in range(2)]
        try:
            for s, port in zip(socks, (p, p + 10000), strict=True):
                s.bind(("127.0.0.1", port))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port pair (p, p + 10000) below the ephemeral range")


def _start_node(server: str, workdir: Path, port: int, node_timeout_ms: int) -> subprocess.Popen[bytes]:
    d = workdir / str(port)
    d.mkdir(parents=True, exist_ok=True)
    log = d / "redis.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
             "--cluster-enabled", "yes", "--cluster-config-file", str(d / "nodes.conf"),
             "--cluster-node-timeout", str(node_timeout_ms),
             "--cluster-require-full-coverage", "no", "--cluster-replica-validity-factor", "0",
             "--appendonly", "no", "--save", ""],
            stdout=fh, stderr=subprocess.STDOUT)
    _wait_port(port, proc, 20.0, log)
    return proc


@contextmanager
def run_cluster(workdir: Path, masters: int = 3, replicas: int = 1,
                node_timeout_ms: int = 1000) -> Iterator[Cluster]:
    """A ready cluster of ``masters`` x (1 + ``replicas``) nodes; killed on exit."""
    server, cli = cluster_binaries()
    ports: list[int] = []
    while len(ports) < masters * (1 + replicas):
        p = _free_bus_pair()
        if p not in ports:
            ports.append(p)
    c = Cluster(workdir, cli, ports)
    try:
        for p in ports:
            c.procs[p] = _start_node(server, workdir, p, node_timeout_ms)
        r = subprocess.run([cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
                            "--cluster-replicas", str(replicas), "--cluster-yes"],
                           capture_output=True, timeout=60, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {r.stdout.decode()[-2000:]}"
                               f"{r.stderr.decode()[-2000:]}")
        c.wait_ok(60.0)
        yield c
    finally:
        for proc in c.procs.values():  # all at once: a node's shutdown takes a while
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)  # a stopped node cannot act on SIGTERM
                proc.terminate()
        for proc in c.procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                _stop(proc)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A real 3-master, 3-replica Redis Cluster on 127.0.0.1 (shared by the session's
    non-destructive tests; a test that kills nodes starts its own with ``run_cluster``).
    Node timeout 2 s: a node starved of CPU on a loaded host is not failed over meanwhile."""
    with run_cluster(tmp_path_factory.mktemp("rcluster"), node_timeout_ms=2000) as c:
        yield c
