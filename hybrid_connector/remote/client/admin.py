"""Operator calls to a cache server that bind no model: ``ping`` (LMCache's HEALTH, timed)
and ``stats`` (the hybrid ``STATS``). Both raise ``ServerUnavailable`` when the server
cannot be reached in time and ``ServerRefused`` when it refuses (a wrong token)."""

from __future__ import annotations

import time
from typing import Any

from hybrid_connector.core.config_server import host_port
from hybrid_connector.remote.client.connection import Connection, ServerRefused
from hybrid_connector.remote.wire import messages as m
from hybrid_connector.remote.wire.frames import REPLY_BYTES, Code, Ext, parse_reply, request
from hybrid_connector.tiers.lm_protocol import Command


def ping(url: str, token: str | None = None, timeout_s: float = 5.0) -> float:
    """Seconds for one HEALTH round trip (after connecting and authenticating)."""
    conn = Connection(*host_port(url), timeout_s, token)
    try:
        t0 = time.perf_counter()
        conn.sock.sendall(request(int(Command.HEALTH)))
        code, _ = parse_reply(bytes(conn._recv_exact(REPLY_BYTES)), 0)
        if code != Code.OK:
            raise ServerRefused(code, "HEALTH failed")
        return time.perf_counter() - t0
    finally:
        conn.close()


def stats(url: str, token: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """The server's ``StatsReply`` as a dict."""
    conn = Connection(*host_port(url), timeout_s, token)
    try:
        reply, _ = conn.expect(Ext.STATS, m.Empty(), m.StatsReply)
        return {f: getattr(reply, f) for f in reply.__struct_fields__}
    finally:
        conn.close()
