"""One client connection on the event loop: admission, framing, authentication, limits,
deadlines.

Each connection is a coroutine; cache work runs on the server's worker threads, so a slow
or hostile client holds only its own coroutine. A new connection passes ``Admission``
(caps on connections). Per frame: the header must arrive within ``idle_timeout_s``, the
body within ``frame_timeout_s`` plus its size at ``min_rate``, and the reply must drain
within the same bound and make progress every ``stall_timeout_s`` (a client that stops
reading is cut off, its unsent bytes dropped). Frame bodies wait for room under
``max_inflight_bytes`` before they are read, and so do replies before they are made, within
their peer address's share first (``Room``). With a token set, a connection must authenticate within ``auth_timeout_s``;
before it has, only frames up to ``max_auth_frame_bytes`` are read, out of their own budget
(``max_unauthenticated`` of them): a larger one is refused before its body. A header that does not
parse, a wrong token, or a deadline missed closes the connection (after a reply where the
protocol has one); a bad hybrid message is answered ``BAD_REQUEST`` and the connection goes
on. With ``admin_token`` set, ``ADMIN`` commands need a connection that authenticated with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from hybrid_connector.core.config_server import ServerSettings
from hybrid_connector.remote.wire.frames import (
    HEADER_BYTES,
    REPLY_BYTES,
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
from hybrid_connector.server.admission import Admission, Link
from hybrid_connector.server.gate import ByteGate
from hybrid_connector.server.plain import head_size as plain_head
from hybrid_connector.server.reader import SPILL_LIMIT, FrameProtocol
from hybrid_connector.server.room import Room, load_bound
from hybrid_connector.server.service import Conn, Reply, Service, decode, error
from hybrid_connector.tiers.lm_protocol import Command

log = logging.getLogger(__name__)
Buffer = bytes | bytearray | np.ndarray  # a frame body
Parts = list[bytes | memoryview]
Out = tuple[bool, int, Parts]  # keep the connection, reply code, reply bytes
CHUNK = 1 << 20  # body bytes budgeted at a time under max_inflight_bytes
ADMIN = frozenset({Ext.FLUSH})  # commands that need the admin token when one is set
_MISS_META = (1, 2, 0, 0, 0, 0)  # what lmcache_server sends: KV_2LTD, float16, no shape


def _same(a: str, b: str | None) -> bool:
    return b is not None and hmac.compare_digest(a.encode(), b.encode())


class Handler:
    """Serves connections for one ``Service``; ``counts`` tallies (command, code)."""

    def __init__(self, service: Service, settings: ServerSettings,
                 observe: Callable[[str, int, float], None] | None = None) -> None:
        self.service = service
        self.s = settings
        self.pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="hc-server")
        self.gate = ByteGate(settings.max_inflight_bytes)
        # before AUTH: each of at most max_unauthenticated connections reads one small frame
        self.auth_gate = ByteGate(settings.max_unauthenticated * settings.max_auth_frame_bytes)
        self.replies = Room(self.gate, settings.reply_share_bytes)
        self.admission = Admission(settings)
        self.counts: Counter[tuple[str, int]] = Counter()
        self.observe = observe
        self.active: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self.busy: set[asyncio.Task[Any]] = set()  # those inside a frame (header read)
        self.stopping = False  # set by ``close_idle``: finish the current frame, then close

    def close_idle(self) -> None:
        """Stopping: close the connections waiting for a header now (they hold nothing;
        an engine keeps idle pooled connections open); the others close after their frame.
        Closing (not cancelling) lets each handler end through its EOF path."""
        self.stopping = True
        for task, writer in list(self.active.items()):
            if task not in self.busy:
                writer.close()

    def stats(self) -> dict[str, int]:
        """The connection layer's figures (``STATS``' ``server.net``)."""
        return {**self.admission.counts(), "inflight_bytes": self.gate.used,
                "inflight_peak": self.gate.peak,
                "waiting_for_room": self.gate.waiting + self.replies.waiting,
                "reply_bytes": self.replies.used, "reply_peak": self.replies.peak,
                "auth_inflight_bytes": self.auth_gate.used,
                "auth_inflight_peak": self.auth_gate.peak}

    def _deadline(self, nbytes: int) -> float:
        return self.s.frame_timeout_s + nbytes / self.s.min_rate

    async def offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the worker threads."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def __call__(self, reader: FrameProtocol, writer: asyncio.StreamWriter) -> None:
        conn = Conn(authed=self.s.token is None)
        peer = writer.get_extra_info("peername")
        link = self.admission.admit(str(peer[0]) if isinstance(peer, tuple) else str(peer),
                                    writer.transport.abort, conn.authed)
        if link is None:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        if task is not None:
            self.active[task] = writer
        self.replies.join(link.peer)
        if not conn.authed:  # nothing but a small AUTH is read before it succeeds
            reader.spill_limit = self.s.max_auth_frame_bytes
        auth_by = asyncio.get_running_loop().time() + self.s.auth_timeout_s
        try:
            while await self._next(conn, link, reader, writer, auth_by):
                pass
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass  # the client went away or missed a deadline: nothing of its frame is kept
        except asyncio.CancelledError:
            raise
        except Exception:  # never let one connection take the server down
            log.exception("connection handler failed")
        finally:
            self.admission.leave(link)
            self.replies.leave(link.peer)
            if task is not None:
                self.active.pop(task, None)
                self.busy.discard(task)
            writer.close()
            await self._settle(conn)
            await self.offload(self.service.disconnected, conn)

    async def _next(self, conn: Conn, link: Link, reader: FrameProtocol,
                    writer: asyncio.StreamWriter, auth_by: float) -> bool:
        """One frame; before AUTH succeeded, all of it within the AUTH deadline."""
        if conn.authed:
            return await self._frame(conn, link, reader, writer)
        cm = asyncio.timeout_at(auth_by)
        try:
            async with cm:
                keep = await self._frame(conn, link, reader, writer)
        except TimeoutError:
            if cm.expired():
                self.admission.timed_out(link)
            raise
        if conn.authed:
            reader.spill_limit = SPILL_LIMIT
        return keep

    async def _send(self, writer: asyncio.StreamWriter, parts: Parts) -> None:
        if writer.transport.is_closing():  # gone while its reply waited (uvloop would raise)
            raise ConnectionResetError("connection closed before its reply")
        for p in parts:
            writer.write(p)
        await self._drain(writer, sum(len(p) for p in parts))

    async def _drain(self, writer: asyncio.StreamWriter, nbytes: int) -> None:
        """Wait until the transport took the reply (down to its high-water mark), within
        the frame's deadline and with progress at least every ``stall_timeout_s``: a client
        that reads slowly gets the long deadline, one that stopped reading is cut after the
        short one. Cut means aborted, so its unsent bytes are freed at once (a plain close
        would keep them until they drained)."""
        loop = asyncio.get_running_loop()
        stop = loop.time() + self._deadline(nbytes)
        transport = writer.transport
        left = transport.get_write_buffer_size()
        while True:
            try:
                await asyncio.wait_for(writer.drain(),
                                       max(0.0, min(self.s.stall_timeout_s, stop - loop.time())))
                return
            except TimeoutError:
                now = transport.get_write_buffer_size()
                if now >= left or loop.time() >= stop:
                    transport.abort()
                    raise
                left = now

    async def _frame(self, conn: Conn, link: Link, reader: FrameProtocol,
                     writer: asyncio.StreamWriter) -> bool:
        raw = await asyncio.wait_for(reader.readexactly(HEADER_BYTES), self.s.idle_timeout_s)
        try:
            h = parse_header(raw, self.s.max_frame_bytes)
        except FrameError as exc:
            code: int = Code.TOO_LARGE if "above the limit" in str(exc) else Code.BAD_REQUEST
            self.counts[("invalid", code)] += 1
            await self._send(writer, [reply(code)])
            return False  # the body's extent cannot be trusted: close
        n, gate = h.length, self.gate
        if not conn.authed:
            if n > self.s.max_auth_frame_bytes:
                await self._refuse_unauthenticated(h, writer)
                return False  # before its body is read
            gate = self.auth_gate
        if h.command == Command.PUT and n > self.s.max_object_bytes:
            self.counts[("PUT", Code.TOO_LARGE)] += 1
            return False  # PUT has no reply: refuse by closing, before reading the body
        task = asyncio.current_task()
        if task is not None:
            self.busy.add(task)
        held, room = [0], self.replies.hold(self.replies.share_of(link.peer))
        later = False
        try:
            prefix = plain_head(h.key) if h.command == Command.PUT else 0
            body = await self._body(reader, n, held, gate, prefix)
            await self._settle(conn)  # a connection's frames take effect in order
            t0 = asyncio.get_running_loop().time()
            name = Ext(h.command).name if h.is_ext else Command(h.command).name
            if h.command == Command.PUT and n and conn.authed and self.s.plain_lmcache:
                # No reply: store it while the next frame is read (its command waits).
                conn.pending = asyncio.ensure_future(self._put(h, body, held[0], t0))
                later = True
                return not self.stopping
            bound = self._reply_bound(conn, h, body)
            if bound:  # room for the reply before it is made; the request's goes first
                await gate.release(held[0])
                held[0] = 0
                await room.reserve(bound, self._deadline(bound))
            keep, code, parts = (await self._ext(conn, link, h, body) if h.is_ext
                                 else await self._plain(conn, h))
            del body  # the request's room goes before its reply is sent
            await gate.release(held[0])
            held[0] = 0
            await room.fit(sum(len(p) for p in parts))
            await self._send(writer, parts)
        finally:
            if not later:
                await gate.release(held[0])
            await room.release()
            if task is not None:
                self.busy.discard(task)
        self._count(name, code, t0)
        return keep and not self.stopping

    def _reply_bound(self, conn: Conn, h: Header, body: Buffer) -> int:
        """The most a large reply can be, reserved before it is made: a plain GET's object
        as stored now (at most ``max_object_bytes``; a miss: its small reply), the sizes a
        LOAD's plan names; 0 for the others (small replies, charged once made)."""
        if not conn.authed:
            return 0
        if h.command == Command.GET and not h.is_ext:
            size = self.service.plain.size(h.key) if self.s.plain_lmcache else None
            return min(self.s.max_object_bytes, size or 0) + REPLY_BYTES
        if h.is_ext and h.command == Ext.LOAD:
            with contextlib.suppress(FrameError):
                message, _ = split_body(memoryview(body))  # type: ignore[arg-type]
                return load_bound(message, self.s.max_frame_bytes)
        return 0

    async def _refuse_unauthenticated(self, h: Header, writer: asyncio.StreamWriter) -> None:
        """A frame too large to be an AUTH before AUTH succeeded: answered (PUT: not) and
        the connection closed, its body never read."""
        if h.is_ext:
            code = Code.TOO_LARGE if h.command == Ext.AUTH else Code.UNAUTHORIZED
            await self._send(writer, self._parts(error(code, "frame too large before AUTH")))
        elif h.command != Command.PUT:
            await self._send(writer, [reply(Code.UNAUTHORIZED)])
        self.counts[("unauthenticated", Code.TOO_LARGE)] += 1

    def _count(self, name: str, code: int, t0: float) -> None:
        self.counts[(name, code)] += 1
        if self.observe is not None:
            self.observe(name, code, asyncio.get_running_loop().time() - t0)

    async def _put(self, h: Header, body: Buffer, held: int, t0: float) -> None:
        """A plain PUT, stored behind the connection's next read; its in-flight room is
        held until it is stored."""
        try:
            ok = await self.offload(self.service.plain.put_framed, h.key, h.meta, body)
            self._count("PUT", Code.OK if ok else Code.FAIL, t0)
        finally:
            await self.gate.release(held)

    @staticmethod
    async def _settle(conn: Conn) -> None:
        """Wait for the connection's PUT still being stored (it never raises here)."""
        if conn.pending is not None:
            pending, conn.pending = conn.pending, None
            with contextlib.suppress(Exception):
                await pending

    async def _body(self, reader: FrameProtocol, n: int, held: list[int], gate: ByteGate,
                    prefix: int = 0) -> Buffer:
        """``n`` body bytes read straight into one buffer (after ``prefix`` free bytes, so a
        plain PUT is stored without another copy) within the frame's deadline, room under
        ``gate`` taken in ``CHUNK`` pieces just before they arrive (``held[0]``: bytes
        taken, for the caller to give back), so a client that announces a large frame and
        trickles holds only what it sent. ``IncompleteReadError`` at EOF, ``TimeoutError``
        past the deadline."""
        if n == 0:
            return bytearray(prefix) if prefix else b""
        loop = asyncio.get_running_loop()
        stop = loop.time() + self._deadline(n)
        # uninitialised (a bytearray is zeroed first): every byte is overwritten below
        buf = torch.empty(prefix + n, dtype=torch.uint8).numpy()
        view, got = memoryview(buf)[prefix:], 0  # type: ignore[arg-type]
        while got < n:
            piece = min(CHUNK, n - got)
            await asyncio.wait_for(gate.acquire(piece), max(0.0, stop - loop.time()))
            held[0] += piece
            await asyncio.wait_for(reader.readinto(view[got : got + piece]),
                                   max(0.0, stop - loop.time()))
            got += piece
        return buf

    async def _ext(self, conn: Conn, link: Link, h: Header, body: Buffer) -> Out:
        command = Ext(h.command)
        keep = True
        try:
            message, payloads = split_body(memoryview(body))  # type: ignore[arg-type]
        except FrameError as exc:
            r = error(Code.BAD_REQUEST, str(exc))
        else:
            if command is Ext.AUTH:
                r = self._auth(conn, link, message)
                keep = r.code == Code.OK
            elif not conn.authed:
                r, keep = error(Code.UNAUTHORIZED, "AUTH with the server's token first"), False
            elif command in ADMIN and self.s.admin_token is not None and not link.admin:
                r = error(Code.UNAUTHORIZED, f"{command.name} needs the admin token")
            else:
                r = await self.offload(self.service.ext, conn, command, message, payloads)
        return keep, r.code, self._parts(r)

    def _auth(self, conn: Conn, link: Link, message: memoryview) -> Reply:
        try:
            token = decode(Ext.AUTH, message).token  # type: ignore[attr-defined]
        except Exception as exc:  # any malformed AUTH is a failed one
            return error(Code.UNAUTHORIZED, f"bad AUTH: {type(exc).__name__}")
        admin = _same(token, self.s.admin_token)
        open_server = self.s.token is None and self.s.admin_token is None
        if not (admin or open_server or _same(token, self.s.token)):
            conn.authed = False
            return error(Code.UNAUTHORIZED, "wrong token")
        conn.authed = True
        self.admission.authenticated(link, admin)
        return Reply(Code.OK, b"\x80")

    @staticmethod
    def _parts(r: Reply) -> Parts:
        size = sum(len(p) for p in r.payloads)
        return [reply(r.code, body_length(r.message, size)), pack_body(r.message, size),
                *r.payloads]

    async def _plain(self, conn: Conn, h: Header) -> Out:
        if not self.s.plain_lmcache or not conn.authed:
            return False, Code.UNAUTHORIZED, ([] if h.command == Command.PUT
                                               else [reply(Code.UNAUTHORIZED)])
        plain = self.service.plain
        if h.command == Command.PUT:  # an empty one (the others are stored by ``_put``)
            return True, Code.FAIL, []
        if h.command == Command.GET:
            got = await self.offload(plain.get, h.key)
            if got is None:
                return True, Code.FAIL, [reply(Code.FAIL, 0, _MISS_META)]
            meta, data = got
            return True, Code.OK, [reply(Code.OK, len(data), meta), data]
        if h.command == Command.EXIST:
            code = Code.OK if await self.offload(plain.exists, h.key) else Code.FAIL
            return True, code, [reply(code, 0, _MISS_META)]
        if h.command == Command.LIST:
            data = "\n".join(await self.offload(plain.names)).encode()
            return True, Code.OK, [reply(Code.OK, len(data)), data]
        return True, Code.OK, [reply(Code.OK, 0, _MISS_META)]  # HEALTH

    def close(self) -> None:
        self.pool.shutdown(wait=True)
