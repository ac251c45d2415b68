"""The hostile clients of ``benchmarks/server_soak.py``: issue 25's items 1-7 at once, one
thread each, against one server, replaying the recipes of
``tests/server/test_server_hardening_conn.py`` (1-3) and
``tests/server/test_server_hardening_service.py`` (4-7) with their helpers, in a loop.

Run as ``python benchmarks/soak_attacks.py CONFIG_JSON``; it prints ``ready`` once every
attacker is set up, attacks until a line arrives on stdin, then prints one JSON line: per
item, what it did and what the server answered. Unauthenticated attackers (1, 2) connect
from ``127.0.0.2``, authenticated ones (3-7: a malicious client holding the token) from
``127.0.0.3``, so the server sees them as peers other than the honest clients'
(``127.0.0.1``): ``max_connections_per_peer`` is one of the bounds under test. Item 3 is
authenticated: before AUTH a GET is refused unread, so only a client with the token can
ask for replies it never reads. Each attacker paces itself (``rate``, a multiplier): the
point is the server's bounds, not a CPU race with the honest clients on a shared machine.
"""

# ruff: noqa: E402  (imports follow the sys.path fix below)
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(_HERE)
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "server")]

import json
import select
import socket
import threading
import time
from collections import Counter
from typing import Any

import msgspec
from raw_client import Raw
from test_server_hardening_conn import flood
from test_server_hardening_service import acquire, hello, plan_of, why

from hybrid_connector.core.config import load_config
from hybrid_connector.core.config_server import host_port
from hybrid_connector.remote.wire import messages as m
from hybrid_connector.remote.wire.frames import Code, Ext, request
from hybrid_connector.tiers.lm_protocol import Command, key_string, kind_model

UNAUTH_PEER, AUTH_PEER = "127.0.0.2", "127.0.0.3"
MiB = 1 << 20


class Conn(Raw):
    """``Raw`` from a chosen source address, optionally with a small receive buffer (set
    before connecting) and authenticated."""

    def __init__(self, url: str, source: str, token: str | None = None,
                 timeout: float = 10.0, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.bind((source, 0))
        try:
            self.sock.connect(host_port(url))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if token is not None and self.call(Ext.AUTH, m.Auth(token))[0] != Code.OK:
                raise ConnectionError("AUTH refused")
        except BaseException:
            self.sock.close()
            raise


class Attack(threading.Thread):
    """One item's attacker: ``setup`` once, then ``step`` until stopped; an ``OSError``
    (the server cut it, as it may) is counted and the step retried."""

    item = 0

    def __init__(self, cfg: dict[str, Any], stop: threading.Event) -> None:
        super().__init__(daemon=True, name=f"attack-{self.item}")
        self.cfg, self.stop = cfg, stop
        self.url, self.token = cfg["url"], cfg["token"]
        self.pace = 1.0 / float(cfg.get("rate", 1.0))
        self.c: Counter[str] = Counter()
        self.notes: list[str] = []

    def setup(self) -> None:
        self.connect()

    def connect(self) -> None:
        """(Re)open this attacker's connection, if it keeps one (after the server cut it)."""

    def step(self) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        pass

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.step()
            except Exception as exc:  # OSError: cut by the server; anything else: a surprise
                self.c["cut_or_failed" if isinstance(exc, OSError) else "unexpected"] += 1
                if len(self.notes) < 3:
                    self.notes.append(f"{type(exc).__name__}: {exc}")
                self.stop.wait(0.1)
                try:
                    self.connect()
                except Exception as exc2:
                    self.c["reconnect_failed"] += 1
                    if len(self.notes) < 5:
                        self.notes.append(f"reconnect: {type(exc2).__name__}: {exc2}")
        self.teardown()

    def wait(self, seconds: float) -> None:
        self.stop.wait(seconds * self.pace)

    def report(self) -> dict[str, Any]:
        return {"item": self.item, "name": type(self).__name__, **self.c, "notes": self.notes}

    def authed(self, **kw: Any) -> Conn:
        return Conn(self.url, AUTH_PEER, self.token, **kw)


class BigAuth(Attack):
    """1: announce a 64 MiB AUTH frame, send up to 39 MiB of it unauthenticated."""

    item = 1

    def step(self) -> None:
        with Conn(self.url, UNAUTH_PEER, timeout=5.0) as r:
            r.send(request(int(Ext.AUTH), 64 * MiB))
            out: dict[str, int] = {}
            flood(r.sock, 39 * MiB, out)
            self.c["frames"] += 1
            self.c["bytes_sent"] += out["sent"]
            self.c["max_sent_one"] = max(self.c["max_sent_one"], out["sent"])
            self.c["closed_by_server"] += r.closed_by_peer(within=30.0)
        self.wait(0.2)


class Silent(Attack):
    """2: connections that never authenticate: silent, a few header bytes, or an AUTH of
    ``max_auth_frame_bytes`` missing its last 4 KiB; opened 12 per step, kept until the
    server closes them (at most ``max_open`` at once on the attacker's side)."""

    item = 2

    def setup(self) -> None:
        self.socks: list[socket.socket] = []
        self.max_open = int(self.cfg.get("silent_max_open", 300))
        self.partial = request(int(Ext.AUTH), self.cfg["max_auth_frame_bytes"]) + b"\x00" * (
            self.cfg["max_auth_frame_bytes"] - 4096)

    def step(self) -> None:
        for i in range(12):
            if len(self.socks) >= self.max_open:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((UNAUTH_PEER, 0))
            s.settimeout(2.0)
            try:
                s.connect(host_port(self.url))
                if i % 3 == 1:
                    s.sendall(request(int(Ext.AUTH), 100)[:10])
                elif i % 3 == 2:
                    s.sendall(self.partial)
                s.setblocking(False)
            except OSError:
                s.close()
                self.c["connect_failed"] += 1
                continue
            self.socks.append(s)
            self.c["opened"] += 1
        self.c["max_open"] = max(self.c["max_open"], len(self.socks))
        ready, _, _ = select.select(self.socks, [], [], 0.0)
        for s in ready:
            try:
                gone = s.recv(65536) == b""
            except BlockingIOError:
                gone = False
            except OSError:
                gone = True
            if gone:
                self.socks.remove(s)
                s.close()
                self.c["closed_by_server"] += 1
        self.wait(0.2)

    def teardown(self) -> None:
        for s in self.socks:
            s.close()


class SlowReaders(Attack):
    """3: GET a large object on ``slow_readers`` connections with a 4 KiB receive buffer
    and never read; a connection the server cuts is replaced."""

    item = 3

    def setup(self) -> None:
        self.key = key_string("5107", "soak-slow")
        size = int(self.cfg["slow_object_bytes"])
        with self.authed(timeout=60.0) as r:
            r.put(self.key, b"\x5a" * size)
            if not r.exist(self.key):
                self.notes.append("the slow object was not stored")
        self.readers: list[Conn] = []

    def step(self) -> None:
        for r in list(self.readers):
            if established(r.sock) is False:
                self.readers.remove(r)
                r.close()
                self.c["cut_by_server"] += 1
        while len(self.readers) < int(self.cfg["slow_readers"]):
            r = self.authed(rcvbuf=4096)
            for _ in range(2):
                r.send(request(int(Command.GET), 0, self.key))
                self.c["gets_never_read"] += 1
            self.readers.append(r)
        self.wait(0.5)

    def teardown(self) -> None:
        for r in self.readers:
            r.close()


class Models(Attack):
    """4: HELLO with an ever-new ``model_id``."""

    item = 4

    def setup(self) -> None:
        self.i, self.client = 0, client_cfg(self.cfg)
        self.connect()

    def connect(self) -> None:
        self.r = self.authed()

    def step(self) -> None:
        code, _ = hello(self.r, self.client, "atk-models", f"atk-model-{self.i}")
        self.i += 1
        self.c["hellos"] += 1
        self.c["ok" if code == Code.OK else f"code_{code}"] += 1
        self.wait(0.02)

    def teardown(self) -> None:
        self.r.close()


class Names(Attack):
    """5: plain PUTs of distinct names (``names_bytes`` each) into ``names_pool``; every
    50th followed by an EXIST (the server has caught up)."""

    item = 5

    def setup(self) -> None:
        self.i = 0
        self.body = b"\xa5" * int(self.cfg["names_bytes"])
        self.model = kind_model(self.cfg["names_pool"])
        self.connect()

    def connect(self) -> None:
        self.r = self.authed()

    def step(self) -> None:
        for _ in range(50):
            self.r.put(key_string(f"{self.i + 1:x}", self.model), self.body)
            self.i += 1
        self.c["puts"] += 50
        self.c["last_exists"] += self.r.exist(key_string(f"{self.i:x}", self.model))
        self.wait(0.1)

    def teardown(self) -> None:
        self.r.close()


class Forged(Attack):
    """6: LOOKUP + ACQUIRE the honest clients' conversations, LOAD with every size one
    byte more (``accepted`` counts a forged LOAD the server served: a defect), RELEASE."""

    item = 6

    def setup(self) -> None:
        self.i, self.prompts = 0, prompts(self.cfg)
        self.connect()

    def connect(self) -> None:
        self.r = self.authed()
        assert hello(self.r, client_cfg(self.cfg), "atk-forger")[0] == Code.OK

    def step(self) -> None:
        plan = plan_of(self.r, self.prompts[self.i % len(self.prompts)])
        self.i += 1
        code, lease, msg = acquire(self.r, plan)
        if lease is None:
            self.c[f"acquire_refused_{code}"] += 1
            self.wait(0.1)
            return
        forged = msgspec.structs.replace(plan, kv=[
            msgspec.structs.replace(o, nbytes=o.nbytes + 1) for o in plan.kv],
            state=msgspec.structs.replace(plan.state, nbytes=plan.state.nbytes + 1)
            if plan.state else None)
        code, msg, data = self.r.call(Ext.LOAD, m.Load(forged, lease))
        self.c["forged_loads"] += 1
        self.c["accepted" if code == Code.OK else "refused"] += 1
        self.r.call(Ext.RELEASE, m.Release(lease))
        self.wait(0.05)

    def teardown(self) -> None:
        self.r.close()


class Leases(Attack):
    """7: one session ACQUIREs plans until refused, keeps its connection alive with STATS
    every 0.5 s and never RELEASEs; takes more as the old ones expire."""

    item = 7

    def setup(self) -> None:
        self.connect()
        self.plans = [plan_of(self.r, p) for p in prompts(self.cfg)]

    def connect(self) -> None:
        self.r = self.authed()
        assert hello(self.r, client_cfg(self.cfg), "atk-hoarder")[0] == Code.OK

    def step(self) -> None:
        for plan in self.plans:
            for _ in range(int(self.cfg["max_leases_per_session"]) + 1):
                code, lease, msg = acquire(self.r, plan)
                if lease is None:
                    reason = why(msg) if code != Code.OK else "empty_plan"
                    key = next((k for k in ("max_leases_per_session", "max_pinned_fraction",
                                            "empty_plan")
                                if k in reason), f"code_{code}")
                    self.c[f"refused_{key}"] += 1
                    break
                self.c["acquired"] += 1
        code, msg, _ = self.r.call(Ext.STATS, m.Empty())
        if code == Code.OK:
            leases = msgspec.msgpack.decode(msg)["server"]["leases"]
            self.c["max_leases_seen"] = max(self.c["max_leases_seen"], int(leases))
        self.wait(0.5)

    def teardown(self) -> None:
        self.r.close()


def established(sock: socket.socket) -> bool | None:
    """Whether the TCP connection is still ESTABLISHED (Linux ``TCP_INFO``: a peer's close
    shows although unread data sits in front of it); None where that cannot be read."""
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] == 1
    except (OSError, AttributeError):
        return None


ATTACKS = (BigAuth, Silent, SlowReaders, Models, Names, Forged, Leases)


def client_cfg(cfg: dict[str, Any]) -> Any:
    return load_config(overrides={"cache_server": {"url": cfg["url"], "token": cfg["token"]},
                                  **cfg["cache"]}, environ={})


def prompts(cfg: dict[str, Any]) -> list[Any]:
    sys.path.insert(0, _HERE)
    from load_worker import conv_prompt

    return [conv_prompt(c["seed"], c["len"], 64) for c in cfg["conversations"]]


def main() -> None:
    cfg = json.loads(sys.argv[1])
    stop = threading.Event()
    attacks = [a(cfg, stop) for a in ATTACKS if a.item in cfg.get("items", range(1, 8))]
    for a in attacks:
        a.setup()
    t0 = time.perf_counter()
    for a in attacks:
        a.start()
    print("ready", flush=True)
    sys.stdin.readline()
    stop.set()
    for a in attacks:
        a.join(60)
    print(json.dumps({"seconds": round(time.perf_counter() - t0, 2),
                      "items": {str(a.item): a.report() for a in attacks},
                      "alive": [a.name for a in attacks if a.is_alive()]}), flush=True)


if __name__ == "__main__":
    main()
