"""Hostile but real peers on 127.0.0.1 for the remote-tier fault tests, and crafted blobs.

* ``TrickleProxy``: a TCP proxy in front of a real server (lmcache_server, redis-server).
  Bytes pass unchanged until a client connection sends ``marker``; from then on the
  server's replies on that connection are forwarded one byte per ``interval`` seconds and
  counted, so a test can tell how much of a reply the client waited for.
* ``FakeRedis``: a tiny RESP2 server (SET, GET, GETRANGE, EXISTS, DEL, PING, SELECT,
  CLIENT) that answers the commands named in ``overrides`` with canned replies, over
  TLS when given a server context.
* ``FakeLm``: an ``lmcache_server`` look-alike that stores PUTs and answers EXIST, and
  answers every GET with a header announcing ``get_length`` bytes that never come.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import struct
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from hybrid_connector.tiers import codec, lm_protocol


def crafted_blob(header: dict[str, Any] | bytes, body: bytes = b"") -> bytes:
    """A blob (or NVMe file) with a CRC-valid prefix around ``header`` (a dict is dumped as
    JSON; bytes are used verbatim, e.g. 60k nested brackets)."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return codec.PREFIX.pack(codec.MAGIC, codec.VERSION, 0, 0, len(h), zlib.crc32(h)) + h + body


def zstd_frame_claiming(content_size: int, payload: bytes = b"abcd") -> bytes:
    """A well-formed zstd frame whose header claims ``content_size`` decompressed bytes
    (single segment, 8-byte content size, one raw block holding ``payload``)."""
    block = (1 | (len(payload) << 3)).to_bytes(3, "little") + payload  # last, raw
    return struct.pack("<I", 0xFD2FB528) + bytes([0xE0]) + struct.pack("<Q", content_size) + block


class _Server:
    """Accept loop on a free port; ``handle(conn)`` runs in a thread per connection."""

    def __init__(self, handle: Callable[[socket.socket], None],
                 tls: ssl.SSLContext | None = None) -> None:
        self._handle, self._tls = handle, tls
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.port = int(self.srv.getsockname()[1])
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.srv.settimeout(0.05)
        while not self.stop.is_set():
            try:
                c, _ = self.srv.accept()
            except OSError:
                continue
            self.accepted += 1
            self.conns.append(c)
            threading.Thread(target=self._run, args=(c,), daemon=True).start()

    def _run(self, c: socket.socket) -> None:
        try:
            if self._tls is not None:
                c = self._tls.wrap_socket(c, server_side=True)
            self._handle(c)
        except OSError:
            pass
        finally:
            c.close()

    def close(self) -> None:
        self.stop.set()
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        self.srv.close()


class TrickleProxy(_Server):
    def __init__(self, upstream: str, interval: float = 0.02) -> None:
        u = urlparse(upstream)
        assert u.hostname is not None and u.port is not None, upstream
        self.upstream = (u.hostname, u.port)
        self.interval = interval
        self.marker: bytes | None = None
        self.triggered = threading.Event()
        self.trickled = 0  # server bytes forwarded slowly
        super().__init__(self._pipe)

    def url(self, scheme: str) -> str:
        return f"{scheme}://127.0.0.1:{self.port}" + ("/0" if scheme == "redis" else "")

    def _pipe(self, c: socket.socket) -> None:
        u = socket.create_connection(self.upstream)
        self.conns.append(u)
        slow = threading.Event()

        def down() -> None:  # server -> client
            try:
                while data := u.recv(65536):
                    if not slow.is_set():
                        c.sendall(data)
                        continue
                    for i in range(len(data)):
                        if self.stop.is_set():
                            return
                        c.sendall(data[i : i + 1])
                        self.trickled += 1
                        time.sleep(self.interval)
            except OSError:
                pass
            finally:
                c.close()
                u.close()

        threading.Thread(target=down, daemon=True).start()
        tail = b""
        while data := c.recv(65536):
            m = self.marker
            if m is not None and m in tail + data:
                slow.set()  # before forwarding, so the reply is already slow
                self.triggered.set()
            tail = (tail + data)[-256:]
            u.sendall(data)
        u.close()


def _read_line(f: Any) -> bytes:
    line = f.readline()
    if not line:
        raise OSError("client went away")
    return bytes(line)


class FakeRedis(_Server):
    """RESP2 only; ``overrides`` maps a command (upper case) to its canned reply. A
    command neither known nor overridden gets an error reply."""

    def __init__(self, overrides: dict[bytes, bytes], tls: ssl.SSLContext | None = None) -> None:
        self.overrides = overrides
        self.data: dict[bytes, bytes] = {}
        self.commands: list[bytes] = []
        super().__init__(self._serve, tls)

    def url(self) -> str:
        if self._tls is not None:  # a self-signed test certificate
            return (f"rediss://127.0.0.1:{self.port}/0"
                    "?ssl_cert_reqs=none&ssl_check_hostname=false")
        return f"redis://127.0.0.1:{self.port}/0"

    @staticmethod
    def _bulk(v: bytes | None) -> bytes:
        return b"$-1\r\n" if v is None else b"$%d\r\n%s\r\n" % (len(v), v)

    def _reply(self, args: list[bytes]) -> bytes:
        cmd = args[0].upper()
        self.commands.append(cmd)
        if cmd in self.overrides:
            return self.overrides[cmd]
        if cmd == b"PING":
            return b"+PONG\r\n"
        if cmd in (b"CLIENT", b"SELECT"):
            return b"+OK\r\n"
        if cmd == b"SET":
            self.data[args[1]] = args[2]
            return b"+OK\r\n"
        if cmd == b"GET":
            return self._bulk(self.data.get(args[1]))
        if cmd == b"GETRANGE":
            v = self.data.get(args[1], b"")
            return self._bulk(v[int(args[2]) : int(args[3]) + 1])
        if cmd == b"EXISTS":
            return b":%d\r\n" % sum(a in self.data for a in args[1:])
        if cmd == b"DEL":
            return b":%d\r\n" % sum(self.data.pop(a, None) is not None for a in args[1:])
        return b"-ERR unknown command\r\n"

    def _serve(self, c: socket.socket) -> None:
        f = c.makefile("rb")
        while True:
            n = int(_read_line(f)[1:])  # *<n>
            args = []
            for _ in range(n):
                ln = int(_read_line(f)[1:])  # $<len>
                args.append(f.read(ln + 2)[:-2])
            c.sendall(self._reply(args))


class FakeLm(_Server):
    """Stores PUTs, answers EXIST/HEALTH, and answers GET with ``get_length`` announced
    bytes, then sends nothing more."""

    def __init__(self, get_length: int) -> None:
        self.get_length = get_length
        self.keys: set[bytes] = set()
        super().__init__(self._serve)

    def url(self) -> str:
        return f"lm://127.0.0.1:{self.port}"

    def _reply(self, code: int, length: int = 0) -> bytes:
        return lm_protocol.SERVER.pack(code, length, lm_protocol.FMT_BINARY,
                                       lm_protocol.DTYPE_UINT8, length, 0, 0, 0, 0)

    def _serve(self, c: socket.socket) -> None:
        f = c.makefile("rb")
        while True:
            head = f.read(lm_protocol.CLIENT.size)
            if len(head) < lm_protocol.CLIENT.size:
                return
            fields = lm_protocol.CLIENT.unpack(head)
            cmd, length, key = fields[0], fields[1], fields[-1].rstrip()
            if cmd == lm_protocol.Command.PUT:
                f.read(length)
                self.keys.add(key)
            elif cmd == lm_protocol.Command.GET:
                c.sendall(self._reply(lm_protocol.SUCCESS, self.get_length))
                self.stop.wait()  # the body never comes
                return
            else:
                ok = cmd == lm_protocol.Command.HEALTH or key in self.keys
                c.sendall(self._reply(lm_protocol.SUCCESS if ok else lm_protocol.FAIL))
