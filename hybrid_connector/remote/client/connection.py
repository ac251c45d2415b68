"""One blocking connection to a cache server: a socket with a deadline per call.

``call`` sends one hybrid frame and returns the reply's code, message and payload bytes.
Any socket error, timeout or malformed reply raises ``ServerUnavailable`` and leaves the
connection closed (the caller discards it); a server-side refusal is a reply with its code.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import msgspec

from hybrid_connector.remote.wire import messages as m
from hybrid_connector.remote.wire.frames import (
    REPLY_BYTES,
    Code,
    Ext,
    FrameError,
    body_length,
    pack_body,
    parse_reply,
    request,
    split_body,
)

_ENC = msgspec.msgpack.Encoder()
MAX_REPLY = 1 << 34


class ServerUnavailable(ConnectionError):
    """The server could not be reached or did not answer in time."""


class ServerRefused(RuntimeError):
    """The server answered a call with an error code (``code``, ``message``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"cache server refused ({code}): {message}")
        self.code = code


class Connection:
    """A connected, authenticated socket (``AUTH`` sent when ``token`` is set)."""

    def __init__(self, host: str, port: int, timeout_s: float, token: str | None = None) -> None:
        self.timeout_s = timeout_s
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise ServerUnavailable(f"cannot connect to {host}:{port}: {exc}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.closed = False
        if token is not None:
            self.expect(Ext.AUTH, m.Auth(token), m.Empty)

    def _recv_exact(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise ServerUnavailable("server closed the connection")
            got += k
        return buf

    def call(self, command: Ext, msg: m.Msg, payloads: Sequence[bytes | memoryview] = ()
             ) -> tuple[int, memoryview, memoryview]:
        """(code, message, payloads) of the reply; ``ServerUnavailable`` on any failure."""
        if self.closed:
            raise ServerUnavailable("connection is closed")
        raw = _ENC.encode(msg)
        size = sum(len(p) for p in payloads)
        try:
            self.sock.sendall(request(int(command), body_length(raw, size)) + pack_body(raw, size))
            for p in payloads:
                self.sock.sendall(p)
            code, n = parse_reply(bytes(self._recv_exact(REPLY_BYTES)), MAX_REPLY)
            message, rest = split_body(memoryview(self._recv_exact(n)))
        except (OSError, FrameError, ServerUnavailable) as exc:
            self.close()
            raise ServerUnavailable(f"{type(exc).__name__}: {exc}") from None
        return code, message, rest

    def expect(self, command: Ext, msg: m.Msg, reply_type: type[m.Msg],
               payloads: Sequence[bytes | memoryview] = ()) -> tuple[m.Msg, memoryview]:
        """``call`` decoded into ``reply_type``; ``ServerRefused`` for an error reply."""
        code, message, rest = self.call(command, msg, payloads)
        if code != Code.OK:
            try:
                why = msgspec.msgpack.decode(message, type=m.Error).message
            except msgspec.MsgspecError:
                why = "(no reason given)"
            raise ServerRefused(code, why)
        try:
            return msgspec.msgpack.decode(message, type=reply_type), rest
        except msgspec.MsgspecError as exc:
            self.close()
            raise ServerUnavailable(f"malformed reply: {exc}") from None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()
