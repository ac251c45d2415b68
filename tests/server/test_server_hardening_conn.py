"""The server's connection layer against hostile clients, by behaviour: an unauthenticated
client announcing a huge AUTH frame, many silent connections that never authenticate (a
server with few file descriptors), clients that request large replies and never read them;
admin commands and the HTTP side's token. Deadlines are generous; figures come from the
server's own accounting (``Handler.stats``), never from timing or RSS."""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fault_support import healthy, payload, wait_for
from raw_client import Raw, lm_key
from server_support import ServerProcess, served, server_config

from hybrid_connector.remote.client import admin
from hybrid_connector.remote.wire import messages as m
from hybrid_connector.remote.wire.frames import Code, Ext, request
from hybrid_connector.tiers.lm_protocol import Command

TOKEN = "s3cret-token-0123"
ADMIN = "admin-token-4567"


def config(tmp: Path, **server: Any) -> dict[str, Any]:
    return server_config(tmp, host_mb=256, server={"idle_timeout_s": 60.0, **server})


def flood(sock: socket.socket, nbytes: int, out: dict[str, int]) -> None:
    """Send ``nbytes`` zero bytes until done or the server stops taking them (``out``:
    bytes sent)."""
    piece, sent = b"\x00" * (1 << 20), 0
    try:
        while sent < nbytes:
            sock.sendall(piece[: min(len(piece), nbytes - sent)])
            sent += min(len(piece), nbytes - sent)
    except OSError:  # closed by the server, or blocked past the socket timeout
        pass
    out["sent"] = sent


# ---------------------------------------------------------------- 1: the in-flight budget
def test_an_unauthenticated_client_cannot_hold_the_inflight_budget(tmp_path: Path) -> None:
    """Recipe: a client that never authenticates announces a 64 MiB AUTH frame and sends
    39 MiB of it, with ``max_inflight_bytes`` 32 MiB. Before, its body was read first (AUTH
    is checked after), filled the budget, and an authenticated client's AUTH and STATS
    waited for room until the attacker's frame deadline (32 s here). Now a frame larger
    than ``max_auth_frame_bytes`` is refused before AUTH, unread."""
    cfg = config(tmp_path, token=TOKEN, max_inflight_bytes="32MiB", max_frame_bytes="64MiB",
                 max_object_bytes="32MiB", frame_timeout_s=30.0)
    with served(cfg) as server:
        attacker = Raw(server.url, timeout=10.0)
        attacker.send(request(int(Ext.AUTH), 64 << 20))
        sent: dict[str, int] = {}
        t = threading.Thread(target=flood, args=(attacker.sock, 39 << 20, sent))
        t.start()
        try:
            time.sleep(1.0)  # its body is on the way (before: being read into the budget)
            t0 = time.monotonic()
            stats = admin.stats(server.url, TOKEN, timeout_s=10.0)
            took = time.monotonic() - t0
            assert stats["server"]["net"]["inflight_bytes"] < 1 << 10  # STATS' own frame
            assert attacker.closed_by_peer(within=10.0)
        finally:
            attacker.close()
            t.join(30)
        assert took < 10.0, took
        net = server.handler.stats()
        assert net["inflight_peak"] < 1 << 20 and net["auth_inflight_peak"] < 1 << 20, net
        healthy_authed(server.url)


def test_partial_auth_frames_are_bounded_by_their_own_budget(tmp_path: Path) -> None:
    """Recipe: 40 connections each announce an AUTH of ``max_auth_frame_bytes`` (64 KiB)
    and send all but 4 KiB of it, then stall, with ``max_unauthenticated`` 16. They hold
    at most 16 such frames, never room under ``max_inflight_bytes``; the older ones are
    closed as new ones come, and a real client is served at once."""
    cfg = config(tmp_path, token=TOKEN, max_unauthenticated=16, auth_timeout_s=30.0)
    with served(cfg) as server:
        stalled = []
        try:
            for _ in range(40):
                r = Raw(server.url)
                stalled.append(r)
                r.send(request(int(Ext.AUTH), 64 << 10) + b"\x00" * (60 << 10))
            # the oldest 24 are evicted as the later ones arrive: late on a loaded host
            assert wait_for(lambda: sum(r.closed_by_peer(within=0.01) for r in stalled) >= 24,
                            25.0)
            t0 = time.monotonic()
            assert admin.stats(server.url, TOKEN, timeout_s=10.0)["plain"] is not None
            assert time.monotonic() - t0 < 10.0
            net = server.handler.stats()
            assert net["auth_inflight_peak"] <= 16 << 16 and net["inflight_peak"] < 1 << 16, net
            assert net["evicted"] >= 24 and net["unauthenticated"] <= 16, net
        finally:
            for r in stalled:
                r.close()


# ---------------------------------------------------------------- 2: connections
def open_silent(url: str, n: int, batch: int = 40) -> list[socket.socket]:
    """``n`` connections started without waiting for the server to accept them, ``batch``
    at a time 0.3 s apart (a burst beyond the listen backlog would wait in the kernel for
    SYN-ACK retries, seconds, not for the server)."""
    host, port = url.removeprefix("hc://").rsplit(":", 1)
    socks = []
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex((host, int(port)))
        socks.append(s)
        if i % batch == batch - 1:
            time.sleep(0.3)
    return socks


def all_closed(socks: list[socket.socket], within: float) -> int:
    """How many of ``socks`` the server closed (EOF or reset) within ``within`` s."""
    open_, deadline = set(socks), time.monotonic() + within
    while open_ and time.monotonic() < deadline:
        ready, _, _ = select.select(list(open_)[:500], [], [], 0.2)
        for s in ready:
            try:
                if s.recv(4096) == b"":
                    open_.discard(s)
            except BlockingIOError:
                pass
            except OSError:
                open_.discard(s)
    return len(socks) - len(open_)


def test_silent_connections_cannot_exhaust_a_server_with_few_descriptors(
        tmp_path: Path) -> None:
    """Recipe: the server runs with ``ulimit -n 256``; 400 connections open and never
    send a byte. Before, each was kept until ``idle_timeout_s``: the server ran out of
    descriptors and a real client could not get in. Now the connection cap stays below
    the limit, a new connection closes the oldest one still waiting to authenticate, and
    those that never do are closed at ``auth_timeout_s``."""
    cfg = config(tmp_path, token=TOKEN, auth_timeout_s=3.0)
    cfg["server"]["http_port"] = None
    with ServerProcess(cfg, tmp_path, nofile=256) as srv:
        silent = open_silent(srv.url, 400)
        try:
            time.sleep(1.0)
            t0 = time.monotonic()
            stats = admin.stats(srv.url, TOKEN, timeout_s=10.0)
            assert time.monotonic() - t0 < 10.0
            net = stats["server"]["net"]
            assert net["cap"] < 256 and net["open"] <= net["cap"], net
            assert all_closed(silent, within=30.0) == len(silent)
            assert admin.ping(srv.url, TOKEN, timeout_s=10.0) > 0
            late = admin.stats(srv.url, TOKEN, timeout_s=10.0)["server"]["net"]
            assert late["unauthenticated"] == 0 and late["evicted"] + late["auth_timeouts"] > 0
        finally:
            for s in silent:
                s.close()
        assert srv.terminate() == 0
    text = srv.log.read_text()
    assert "server.max_connections 1024 lowered to" in text, text[-2000:]
    assert "server.max_unauthenticated = 64" in text, text[-2000:]


def test_a_silent_connection_is_closed_at_the_auth_deadline(tmp_path: Path) -> None:
    with served(config(tmp_path, token=TOKEN, auth_timeout_s=1.0)) as server:
        with Raw(server.url) as silent, Raw(server.url) as trickler:
            trickler.send(request(int(Ext.AUTH), 100)[:10])  # part of a header, no more
            assert silent.closed_by_peer(within=10.0) and trickler.closed_by_peer(within=10.0)
        assert server.handler.stats()["auth_timeouts"] >= 2
        healthy_authed(server.url)


def test_the_connection_cap_refuses_with_a_log_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Recipe: no token, ``max_connections`` 4; 4 idle connections, then a fifth. It is
    closed at once with a warning naming the cap; once one closes, a new one is served."""
    with served(config(tmp_path, max_connections=4)) as server:
        idle = [Raw(server.url) for _ in range(4)]
        try:
            assert wait_for(lambda: len(server.handler.active) == 4, 10)
            caplog.clear()
            with caplog.at_level(logging.WARNING), Raw(server.url) as extra:
                assert extra.closed_by_peer(within=10.0)
            assert "server.max_connections = 4" in caplog.text, caplog.text
            idle.pop().close()
            assert wait_for(lambda: len(server.handler.active) == 3, 10)
            with Raw(server.url) as r:
                assert r.health() == Code.OK
        finally:
            for r in idle:
                r.close()
        assert server.handler.stats()["refused"] == 1


def test_the_per_peer_cap_refuses(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with served(config(tmp_path, max_connections_per_peer=2)) as server:
        with Raw(server.url) as a, Raw(server.url) as b:
            assert a.health() == Code.OK and b.health() == Code.OK
            with caplog.at_level(logging.WARNING), Raw(server.url) as c:
                assert c.closed_by_peer(within=10.0)
        assert "server.max_connections_per_peer = 2" in caplog.text, caplog.text


# ---------------------------------------------------------------- 3: replies in flight
def test_replies_nobody_reads_stay_under_the_inflight_budget(tmp_path: Path) -> None:
    """Recipe: one 16 MiB plain object; 10 connections GET it and never read (a 4 KiB
    receive buffer), with ``max_inflight_bytes`` 32 MiB. Before, every GET was read out
    of the store and parked in its connection's send buffer (10 x 16 MiB held for the
    drain deadline). Now a GET waits for room for its reply (the largest object and its
    header) before the object is read: one or two replies are made, the others wait, and
    the bytes counted stay within the budget."""
    size = 16 << 20
    cfg = config(tmp_path, max_inflight_bytes="32MiB", max_object_bytes="16MiB",
                 max_frame_bytes="64MiB", frame_timeout_s=30.0, stall_timeout_s=30.0)
    with served(cfg) as server:
        with Raw(server.url) as r:
            r.put(lm_key(1), payload(1, size))
            assert r.exist(lm_key(1))
        plain = server.service.plain
        before = plain.gets
        readers = []
        try:
            for _ in range(10):
                s = Raw(server.url)
                s.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.send(request(int(Command.GET), 0, lm_key(1)))
                readers.append(s)
            wait_for(lambda: plain.gets - before > 2
                     or server.handler.stats()["waiting_for_room"] >= 8, 20)
            time.sleep(0.5)
            assert plain.gets - before <= 2, plain.gets - before  # replies made
            net = server.handler.stats()
            assert net["reply_bytes"] <= 32 << 20 and net["reply_peak"] <= 32 << 20, net
            assert net["waiting_for_room"] >= 8, net
        finally:
            for s in readers:
                s.close()
        with Raw(server.url, timeout=20.0) as r:  # the stalled ones gone: served again
            assert r.get(lm_key(1)) == payload(1, size)
        assert wait_for(lambda: server.handler.stats()["reply_bytes"] == 0, 10)
        assert server.handler.stats()["reply_peak"] <= 32 << 20


# ---------------------------------------------------------------- admin and HTTP
def healthy_authed(url: str) -> None:
    with Raw(url) as r:
        assert r.call(Ext.AUTH, m.Auth(TOKEN))[0] == Code.OK
        assert r.health() == Code.OK


def test_flush_needs_the_admin_token(tmp_path: Path) -> None:
    with served(config(tmp_path, token=TOKEN, admin_token=ADMIN)) as server:
        with Raw(server.url) as user:
            assert user.call(Ext.AUTH, m.Auth(TOKEN))[0] == Code.OK
            assert user.call(Ext.FLUSH, m.Empty())[0] == Code.UNAUTHORIZED
            assert user.health() == Code.OK  # refused, not cut
        with Raw(server.url) as op:  # the admin token authenticates too; FLUSH passes on
            assert op.call(Ext.AUTH, m.Auth(ADMIN))[0] == Code.OK
            assert op.call(Ext.FLUSH, m.Empty())[0] == Code.BAD_REQUEST  # no HELLO yet
        assert server.handler.counts[("FLUSH", Code.UNAUTHORIZED)] == 1


def get(url: str, token: str | None = None) -> int:
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_http_stats_and_metrics_can_require_the_token(tmp_path: Path) -> None:
    with served(config(tmp_path, token=TOKEN, http_auth=True)) as server:
        base = f"http://127.0.0.1:{server.http_port}"
        assert get(f"{base}/health") == 200
        for path in ("/stats", "/metrics"):
            assert get(base + path) == 401
            assert get(base + path, "wrong-token-000") == 401
            assert get(base + path, TOKEN) == 200


def test_http_can_listen_on_its_own_host(tmp_path: Path) -> None:
    with served(config(tmp_path, http_host="127.0.0.2")) as server:
        assert get(f"http://127.0.0.2:{server.http_port}/stats") == 200
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.http_port), timeout=5).close()
        healthy(server.url)


def test_the_new_bounds_are_checked_at_load() -> None:
    from pydantic import ValidationError

    from hybrid_connector.core.config_server import ServerSettings

    with pytest.raises(ValidationError, match="does not fit in max_auth_frame_bytes"):
        ServerSettings.model_validate({"token": "x" * 2000, "max_auth_frame_bytes": 1024})
    with pytest.raises(ValidationError, match="http_auth needs"):
        ServerSettings.model_validate({"http_auth": True})
    s = ServerSettings.model_validate({})
    assert (s.max_auth_frame_bytes, s.auth_timeout_s, s.max_unauthenticated) == (64 << 10, 10.0, 64)
    assert (s.max_connections, s.max_connections_per_peer, s.admin_token) == (1024, 512, None)


def test_slow_readers_from_one_address_do_not_stall_other_clients(tmp_path: Path) -> None:
    """Recipe: one 12 MiB plain object; 8 connections from 127.0.0.1 GET it and never read
    (a 4 KiB receive buffer), ``max_inflight_bytes`` 64 MiB, ``max_object_bytes`` 16 MiB.
    Before, each GET reserved the largest object's room and an unread reply kept it for the
    drain deadline (``frame_timeout_s`` 30 s plus its size at ``min_rate``), so four of them
    held the whole budget and a client on another address waited that long for a 64 KiB
    GET. Now a GET reserves its object's size, one peer address's replies wait within its
    share (half the budget: two of them) and a reply that makes no progress for
    ``stall_timeout_s`` is cut: the other client is answered at once and the stalled
    connections are closed."""
    big = 12 << 20
    cfg = config(tmp_path, max_inflight_bytes="64MiB", max_object_bytes="16MiB",
                 max_frame_bytes="64MiB", frame_timeout_s=30.0, stall_timeout_s=2.0)
    with served(cfg) as server:
        with Raw(server.url) as r:
            r.put(lm_key(1), payload(1, big))
            r.put(lm_key(2), payload(2))
            assert r.exist(lm_key(1)) and r.exist(lm_key(2))
        readers = []
        try:
            for _ in range(8):
                s = Raw(server.url, timeout=30.0)
                s.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.send(request(int(Command.GET), 0, lm_key(1)))
                readers.append(s)
            plain = server.service.plain
            wait_for(lambda: plain.gets >= 1, 20)
            with Raw(server.url, timeout=15.0, source="127.0.0.2") as other:
                for _ in range(3):
                    assert other.get(lm_key(2)) == payload(2)
            net = server.handler.stats()
            assert net["reply_peak"] <= (32 << 20) + (1 << 20), net  # one peer's share
            # every stalled reply is cut (stall_timeout_s each, not 30 s): none left open
            assert wait_for(lambda: server.handler.stats()["open"] == 0, 60), \
                server.handler.stats()
            assert plain.gets >= 8
        finally:
            for s in readers:
                s.close()
        assert wait_for(lambda: server.handler.stats()["reply_bytes"] == 0, 10)
