"""One client connection on the event loop: framing, authentication, limits, deadlines.

Each connection is a coroutine; cache work runs on the server's worker threads, so a slow
or hostile client holds only its own coroutine. Per frame: the header must arrive within
``idle_timeout_s``, the body within ``frame_timeout_s`` plus its size at ``min_rate``, and
the reply must drain within the same bound (a client that stops reading is cut off). Frame
bodies wait for room under ``max_inflight_bytes`` before they are read. A header that does
not parse, a wrong token, or a deadline missed closes the connection (after a reply where
the protocol has one); a bad hybrid message is answered ``BAD_REQUEST`` and the connection
goes on.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hybrid_connector.config_server import ServerSettings
from hybrid_connector.server.service import Conn, Reply, Service, decode, error
from hybrid_connector.wire.frames import (
    HEADER_BYTES,
    Code,
    Ext,
    FrameError,
    Header,
    body_length,
    pack_body,
    parse_header,
    reply,
    split_body,
)
from tiers.lm_protocol import Command

log = logging.getLogger(__name__)
CHUNK = 4 << 20  # body bytes read (and budgeted) at a time
_MISS_META = (1, 2, 0, 0, 0, 0)  # what lmcache_server sends: KV_2LTD, float16, no shape


class ByteGate:
    """At most ``limit`` bytes of frames in flight at once (a larger frame waits until it
    is alone)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._cond = asyncio.Condition()

    async def acquire(self, n: int) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n

    async def release(self, n: int) -> None:
        async with self._cond:
            self.used -= n
            self._cond.notify_all()


class Handler:
    """Serves connections for one ``Service``; ``counts`` tallies (command, code)."""

    def __init__(self, service: Service, settings: ServerSettings,
                 observe: Callable[[str, int, float], None] | None = None) -> None:
        self.service = service
        self.s = settings
        self.pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="hc-server")
        self.gate = ByteGate(settings.max_inflight_bytes)
        self.counts: Counter[tuple[str, int]] = Counter()
        self.observe = observe
        self.active: set[asyncio.Task[Any]] = set()

    def _deadline(self, nbytes: int) -> float:
        return self.s.frame_timeout_s + nbytes / self.s.min_rate

    async def offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the worker threads."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self.active.add(task)
        conn = Conn(authed=self.s.token is None)
        try:
            while await self._frame(conn, reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass  # the client went away or missed a deadline: nothing of its frame is kept
        except asyncio.CancelledError:
            raise
        except Exception:  # never let one connection take the server down
            log.exception("connection handler failed")
        finally:
            if task is not None:
                self.active.discard(task)
            writer.close()
            await self.offload(self.service.disconnected, conn)

    async def _send(self, writer: asyncio.StreamWriter, parts: list[bytes | memoryview]) -> None:
        for p in parts:
            writer.write(p)
        await asyncio.wait_for(writer.drain(), self._deadline(sum(len(p) for p in parts)))

    async def _frame(self, conn: Conn, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> bool:
        raw = await asyncio.wait_for(reader.readexactly(HEADER_BYTES), self.s.idle_timeout_s)
        try:
            h = parse_header(raw, self.s.max_frame_bytes)
        except FrameError as exc:
            code: int = Code.TOO_LARGE if "above the limit" in str(exc) else Code.BAD_REQUEST
            self.counts[("invalid", code)] += 1
            await self._send(writer, [reply(code)])
            return False  # the body's extent cannot be trusted: close
        n = h.length
        if h.command == Command.PUT and n > self.s.max_object_bytes:
            self.counts[("PUT", Code.TOO_LARGE)] += 1
            return False  # PUT has no reply: refuse by closing, before reading the body
        held = [0]
        try:
            body = await self._body(reader, n, held)
            t0 = asyncio.get_running_loop().time()
            name = Ext(h.command).name if h.is_ext else Command(h.command).name
            keep, code = (await self._ext(conn, h, body, writer) if h.is_ext
                          else await self._plain(conn, h, body, writer))
        finally:
            await self.gate.release(held[0])
        self.counts[(name, code)] += 1
        if self.observe is not None:
            self.observe(name, code, asyncio.get_running_loop().time() - t0)
        return keep

    async def _body(self, reader: asyncio.StreamReader, n: int, held: list[int]) -> bytes:
        """``n`` body bytes within the frame's deadline, taking room under the in-flight
        budget as they arrive (``held[0]``: bytes taken, for the caller to give back), so a
        client that announces a large frame and trickles holds only what it has sent."""
        if n == 0:
            return b""
        loop = asyncio.get_running_loop()
        stop = loop.time() + self._deadline(n)
        parts: list[bytes] = []
        got = 0
        while got < n:
            piece = min(CHUNK, n - got)
            await asyncio.wait_for(self.gate.acquire(piece), max(0.0, stop - loop.time()))
            held[0] += piece
            parts.append(await asyncio.wait_for(reader.readexactly(piece),
                                                max(0.0, stop - loop.time())))
            got += piece
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _ext(self, conn: Conn, h: Header, body: bytes,
                   writer: asyncio.StreamWriter) -> tuple[bool, int]:
        command = Ext(h.command)
        try:
            message, payloads = split_body(body)
        except FrameError as exc:
            r = error(Code.BAD_REQUEST, str(exc))
        else:
            if command is Ext.AUTH:
                r = self._auth(conn, message)
            elif not conn.authed:
                r = error(Code.UNAUTHORIZED, "AUTH with the server's token first")
            else:
                r = await self.offload(self.service.ext, conn, command, message, payloads)
        await self._reply(writer, r)
        return r.code != Code.UNAUTHORIZED, r.code

    def _auth(self, conn: Conn, message: memoryview) -> Reply:
        try:
            token = decode(Ext.AUTH, message).token  # type: ignore[attr-defined]
        except Exception as exc:  # any malformed AUTH is a failed one
            return error(Code.UNAUTHORIZED, f"bad AUTH: {type(exc).__name__}")
        want = self.s.token
        conn.authed = want is None or hmac.compare_digest(token.encode(), want.encode())
        return Reply(Code.OK, b"\x80") if conn.authed else error(Code.UNAUTHORIZED, "wrong token")

    async def _reply(self, writer: asyncio.StreamWriter, r: Reply) -> None:
        size = sum(len(p) for p in r.payloads)
        head = reply(r.code, body_length(r.message, size))
        await self._send(writer, [head, pack_body(r.message, size), *r.payloads])

    async def _plain(self, conn: Conn, h: Header, body: bytes,
                     writer: asyncio.StreamWriter) -> tuple[bool, int]:
        if not self.s.plain_lmcache or not conn.authed:
            if h.command != Command.PUT:
                await self._send(writer, [reply(Code.UNAUTHORIZED)])
            return False, Code.UNAUTHORIZED
        plain = self.service.plain
        if h.command == Command.PUT:
            if n := len(body):
                if n > self.s.max_object_bytes:
                    return False, Code.TOO_LARGE  # PUT has no reply: close instead
                ok = await self.offload(plain.put, h.key, h.meta, body)
                return True, Code.OK if ok else Code.FAIL
            return True, Code.FAIL
        if h.command == Command.GET:
            got = await self.offload(plain.get, h.key)
            if got is None:
                await self._send(writer, [reply(Code.FAIL, 0, _MISS_META)])
                return True, Code.FAIL
            meta, data = got
            await self._send(writer, [reply(Code.OK, len(data), meta), data])
            return True, Code.OK
        if h.command == Command.EXIST:
            code = Code.OK if await self.offload(plain.exists, h.key) else Code.FAIL
            await self._send(writer, [reply(code, 0, _MISS_META)])
            return True, code
        if h.command == Command.LIST:
            data = "\n".join(await self.offload(plain.names)).encode()
            await self._send(writer, [reply(Code.OK, len(data)), data])
            return True, Code.OK
        await self._send(writer, [reply(Code.OK, 0, _MISS_META)])  # HEALTH
        return True, Code.OK

    def close(self) -> None:
        self.pool.shutdown(wait=True)
