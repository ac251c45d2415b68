"""A raw-socket client of our server for fault tests: LMCache's plain frames and hybrid
frames byte by byte, so a test can send what no well-behaved client would (half a body,
a bad header, garbage msgpack) and see exactly what comes back."""

from __future__ import annotations

import socket
import time

import msgspec

from hybrid_connector.core.config_server import host_port
from hybrid_connector.remote.wire import messages as m
from hybrid_connector.remote.wire.frames import (
    REPLY_BYTES,
    Ext,
    body_length,
    pack_body,
    request,
    split_body,
)
from hybrid_connector.tiers.lm_protocol import SERVER, Command, key_string

FMT_BINARY, DTYPE_UINT8 = 4, 6


def lm_key(i: int, model: str = "faults") -> str:
    return key_string(f"{i + 1:x}", model)


class Raw:
    """One socket; every method blocks at most ``timeout`` seconds."""

    def __init__(self, url: str, timeout: float = 10.0, source: str | None = None) -> None:
        """``source``: the local address to connect from (e.g. ``127.0.0.2``: another
        peer address to the server)."""
        self.sock = socket.create_connection(host_port(url), timeout=timeout,
                                             source_address=None if source is None
                                             else (source, 0))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            got = self.sock.recv(n - len(buf))
            if not got:
                raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
            buf += got
        return bytes(buf)

    def reply(self) -> tuple[int, bytes]:
        code, length, *_ = SERVER.unpack(self.recv_exact(REPLY_BYTES))
        return code, self.recv_exact(length) if length else b""

    # ------------------------------------------------------------ plain LMCache
    def put(self, key: str, body: bytes) -> None:
        meta = (FMT_BINARY, DTYPE_UINT8, len(body), 0, 0, 0)
        self.send(request(int(Command.PUT), len(body), key, meta) + body)

    def get(self, key: str) -> bytes | None:
        self.send(request(int(Command.GET), 0, key))
        code, body = self.reply()
        return body if code == 200 else None

    def exist(self, key: str) -> bool:
        self.send(request(int(Command.EXIST), 0, key))
        return self.reply()[0] == 200

    def health(self) -> int:
        self.send(request(int(Command.HEALTH)))
        return self.reply()[0]

    # ------------------------------------------------------------ hybrid
    def ext(self, command: Ext, message: bytes, payload: bytes = b"") -> tuple[int, bytes, bytes]:
        """(code, message, payloads) of one hybrid frame with a raw ``message``."""
        self.send(request(int(command), body_length(message, len(payload)))
                  + pack_body(message) + payload)
        code, body = self.reply()
        msg, rest = split_body(body)
        return code, bytes(msg), bytes(rest)

    def call(self, command: Ext, msg: m.Msg) -> tuple[int, bytes, bytes]:
        return self.ext(command, msgspec.msgpack.encode(msg))

    # ------------------------------------------------------------ state
    def closed_by_peer(self, within: float = 5.0) -> bool:
        """Did the server close this connection (EOF or reset) within ``within`` s?"""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if self.sock.recv(65536) == b"":
                    return True
            except TimeoutError:
                return False
            except OSError:
                return True
        return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
