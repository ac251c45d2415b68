"""Blob store clients of the remote tier: ``lm://`` (LMCache's ``lmcache_server``) and
``redis://`` (Redis, Valkey). ``hybrid_connector.tiers.remote.tier.RemoteTier`` turns their errors into misses.

Every client method is one call under one deadline of ``timeout`` seconds (connect, send
and every receive of every reply together; see ``hybrid_connector.tiers.deadline``), so a server that
trickles its replies cannot stretch it; a batch (``exists_many``) or a read-modify-write
(an lm:// manifest append) is still one call under one deadline. Each in-flight call has a
connection of its own, so calls from several threads run concurrently. Methods raise
``RemoteError`` (or OSError / TimeoutError) on any failure; ``ReplyTooLarge`` and
``hybrid_connector.tiers.manifest.CorruptManifest`` mean the server answered but the data is unusable.

Neither client deletes anything: the remote tier is shared, and objects on it are never
deleted by a cache instance (``lmcache_server`` has no delete command anyway).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlparse

from hybrid_connector.core.keys import ObjectKey
from hybrid_connector.tiers import deadline, lm_protocol, manifest
from hybrid_connector.tiers.deadline import DeadlineSocket
from hybrid_connector.tiers.manifest import CorruptManifest, Limits

T = TypeVar("T")
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)  # Linux only
_EXIST_WINDOW = 64  # EXIST requests in flight on one connection (bounds both socket buffers)


class RemoteError(Exception):
    """A failure talking to the remote: a protocol violation, a refused reply, or any
    exception out of a client library (wrapped with its type and message)."""


class ReplyTooLarge(RemoteError):
    """A reply longer than the caller's bound, refused before it was read."""


class ShardUnavailable(RemoteError):
    """One shard of a cluster (the slots it serves) cannot answer now; the rest may be
    fine, so the tier counts a miss without marking the whole remote down."""


class RemoteClient(ABC):
    """Blob store client; see the module docstring. ``limits`` bound manifests."""

    limits: Limits

    @abstractmethod
    def put(self, name: str, blob: bytes) -> None: ...

    @abstractmethod
    def get(self, name: str, max_len: int) -> bytes | bytearray | None:
        """The blob (None: not stored). A blob longer than ``max_len`` is an error
        (``ReplyTooLarge`` where it can be told before reading; Redis reads at most
        ``max_len`` bytes), detected before anything that size is allocated."""

    def read_head(self, name: str, head_len: int, max_len: int) -> bytes | bytearray | None:
        """At least the first ``head_len`` bytes of the blob (all of it when shorter; None:
        not stored). Stores without range reads read the whole blob, bounded by
        ``max_len`` as ``get``."""
        return self.get(name, max_len)

    @abstractmethod
    def exists(self, name: str) -> bool: ...

    @abstractmethod
    def exists_many(self, names: Sequence[str]) -> list[bool]:
        """Whether each name is stored, asked in one call (pipelined)."""

    @abstractmethod
    def health(self) -> None: ...

    @abstractmethod
    def append_record(self, name: str, record: bytes) -> None:
        """Append ``record`` to manifest ``name`` (see ``hybrid_connector.tiers.manifest``); raises
        ``ReplyTooLarge`` where the stored manifest exceeds ``limits`` (it is left alone)."""

    @abstractmethod
    def records(self, name: str) -> list[bytes]:
        """Manifest ``name``'s records, oldest first ([]: none); records longer than
        ``limits.max_record_bytes`` are skipped. ``CorruptManifest``/``ReplyTooLarge``
        where the stored manifest is unusable."""

    def name_for(self, key: ObjectKey) -> str:
        return key.digest()

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class LmClient(RemoteClient):
    """Raw-socket client of ``lmcache_server`` (see ``hybrid_connector.tiers.lm_protocol``).

    Each call runs under one deadline on a connection of its own: an idle pooled one or a
    new one. It goes back to the pool (at most ``max_idle`` are kept) only after a clean
    exchange; any error closes it. No lock is held during object I/O, so a slow call never
    delays another thread's call (``lmcache_server`` serves each connection in its own
    thread). Manifest appends are read-modify-writes (GET, PUT, then EXIST, which confirms
    the PUT was stored: the server answers a connection's requests in order) serialised
    within this client; see ``hybrid_connector.tiers.manifest`` for what concurrent writers may lose."""

    def __init__(self, host: str, port: int, timeout: float, max_idle: int = 4,
                 limits: Limits | None = None) -> None:
        self.host, self.port, self.timeout, self.max_idle = host, port, timeout, max_idle
        self.limits = limits or Limits()
        self._idle: list[DeadlineSocket] = []
        self._lock = threading.Lock()  # guards _idle only
        self._manifest_lock = threading.Lock()  # one manifest read-modify-write at a time
        self._closed = False

    def name_for(self, key: ObjectKey) -> str:
        return lm_protocol.key_string(key.digest(), lm_protocol.kind_model(key.kind.value))

    @staticmethod
    def manifest_key(name: str) -> str:
        return lm_protocol.key_string(manifest.name_digest(name), lm_protocol.MANIFEST_MODEL_NAME)

    def _connect(self) -> DeadlineSocket:
        s = socket.create_connection((self.host, self.port), timeout=deadline.left())
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return DeadlineSocket(s)

    @staticmethod
    def _recv_exact(s: DeadlineSocket, n: int) -> bytearray:
        buf = bytearray(n)
        mv = memoryview(buf)
        got = 0
        while got < n:
            if _QUICKACK is not None:
                # lmcache_server writes a reply's header and body as two sends without
                # TCP_NODELAY: Nagle holds the body until the header is ACKed, and a
                # delayed ACK here would add ~40 ms to every GET. Linux resets quick-ack
                # mode on its own, so it is asked for before each receive.
                s.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            k = s.recv_into(mv[got:])
            if k == 0:
                raise RemoteError("connection closed by the server")
            got += k
        return buf

    def _do(self, fn: Callable[[DeadlineSocket], T]) -> T:
        with deadline.scope(self.timeout):
            with self._lock:
                s = self._idle.pop() if self._idle else None
            if s is None:
                s = self._connect()
            try:
                out = fn(s)
            except BaseException:
                s.close()  # mid-exchange: the stream is out of step
                raise
        with self._lock:
            keep = not self._closed and len(self._idle) < self.max_idle
            if keep:
                self._idle.append(s)
        if not keep:
            s.close()
        return out

    def _reply(self, s: DeadlineSocket) -> tuple[int, int]:
        try:
            return lm_protocol.parse_reply(bytes(self._recv_exact(s, lm_protocol.SERVER.size)))
        except ValueError as exc:
            raise RemoteError(str(exc)) from exc

    def _ask(self, s: DeadlineSocket, cmd: lm_protocol.Command, name: str) -> tuple[int, int]:
        s.sendall(lm_protocol.request(cmd, name))
        return self._reply(s)

    @staticmethod
    def _put_on(s: DeadlineSocket, name: str, blob: bytes) -> None:
        s.sendall(lm_protocol.request(lm_protocol.Command.PUT, name, len(blob)))
        s.sendall(blob)

    def _get_on(self, s: DeadlineSocket, name: str, max_len: int) -> bytearray | None:
        code, length = self._ask(s, lm_protocol.Command.GET, name)
        if code != lm_protocol.SUCCESS:
            if length:
                raise RemoteError(f"a miss announcing {length} bytes")
            return None
        if length > max_len:  # checked before the buffer is allocated
            raise ReplyTooLarge(f"reply of {length} bytes exceeds the bound {max_len}")
        return self._recv_exact(s, length)

    def put(self, name: str, blob: bytes) -> None:
        self._do(lambda s: self._put_on(s, name, blob))

    def get(self, name: str, max_len: int) -> bytearray | None:
        return self._do(lambda s: self._get_on(s, name, max_len))

    def exists(self, name: str) -> bool:
        return self._do(lambda s: self._ask(s, lm_protocol.Command.EXIST, name)[0]) == lm_protocol.SUCCESS

    def exists_many(self, names: Sequence[str]) -> list[bool]:
        def run(s: DeadlineSocket) -> list[bool]:
            out: list[bool] = []
            for i in range(0, len(names), _EXIST_WINDOW):
                window = names[i:i + _EXIST_WINDOW]
                s.sendall(b"".join(lm_protocol.request(lm_protocol.Command.EXIST, n) for n in window))
                out += [self._reply(s)[0] == lm_protocol.SUCCESS for _ in window]
            return out
        return self._do(run) if names else []

    def health(self) -> None:
        if self._do(lambda s: self._ask(s, lm_protocol.Command.HEALTH, "x@1@0@0@uint8"))[0] != lm_protocol.SUCCESS:
            raise RemoteError("health check failed")

    def append_record(self, name: str, record: bytes) -> None:
        key = self.manifest_key(name)

        def run(s: DeadlineSocket) -> None:
            blob = self._get_on(s, key, self.limits.max_blob_len())
            try:
                old = [] if blob is None else manifest.decode(name, blob, self.limits)
            except CorruptManifest:
                old = []  # unreadable for every reader: replacing it loses nothing readable
            self._put_on(s, key, manifest.encode(name, manifest.trimmed(old + [record], self.limits)))
            if self._ask(s, lm_protocol.Command.EXIST, key)[0] != lm_protocol.SUCCESS:
                raise RemoteError("manifest PUT was not stored")

        with self._manifest_lock:
            self._do(run)

    def records(self, name: str) -> list[bytes]:
        blob = self._do(lambda s: self._get_on(s, self.manifest_key(name), self.limits.max_blob_len()))
        return [] if blob is None else manifest.decode(name, blob, self.limits)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for s in idle:
            s.close()


class _DeadlineConnection:
    """Mixed into redis-py's connection class: its sockets are ``DeadlineSocket`` and its
    TCP connect gets only what is left of the call's deadline."""

    socket_connect_timeout: float | None

    def _connect(self) -> Any:
        rem = deadline.left()
        if rem is not None:
            self.socket_connect_timeout = rem
        return DeadlineSocket(super()._connect())  # type: ignore[misc]


class RedisClient(RemoteClient):
    """``redis://``, ``rediss://``, ``valkey://`` or ``valkeys://`` via redis-py, speaking RESP2 (no
    ``HELLO`` handshake, which Redis-likes answer in odd ways) with no client-side retries
    (the tier's backoff decides when to try again). redis-py's pool gives each in-flight
    call a connection of its own; each call runs under one deadline that its connect,
    handshake, send and every receive share. Reads are ``GETRANGE 0 max_len-1``, so a
    server never has reason to send more than the bound; manifests are lists (see
    ``hybrid_connector.tiers.manifest``) read with ``LRANGE`` of the newest ``limits.max_records``. Any
    exception out of redis-py is a RemoteError, except an error reply to a manifest
    command (e.g. WRONGTYPE: something else sits under its key), a CorruptManifest."""

    def __init__(self, url: str, timeout: float, limits: Limits | None = None) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.timeout = timeout
        self.limits = limits or Limits()
        self._response_error = redis.ResponseError
        url = url.replace("valkeys://", "rediss://", 1).replace("valkey://", "redis://", 1)
        base = redis.SSLConnection if url.startswith("rediss://") else redis.Connection
        self._r = redis.Redis.from_url(
            url, socket_timeout=timeout,
            socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0), protocol=2,
            connection_class=type("DeadlineConnection", (_DeadlineConnection, base), {}))

    def name_for(self, key: ObjectKey) -> str:
        return "hc:" + key.digest()

    def _call(self, fn: Callable[[], T], manifest_op: bool = False) -> T:
        try:
            with deadline.scope(self.timeout):
                return fn()
        except self._response_error as exc:
            if manifest_op:
                raise CorruptManifest(f"{type(exc).__name__}: {exc}") from exc
            raise RemoteError(f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # redis-py can raise anything at an odd server
            raise RemoteError(f"{type(exc).__name__}: {exc}") from exc

    def put(self, name: str, blob: bytes) -> None:
        if self._call(lambda: self._r.set(name, blob)) is not True:
            raise RemoteError("SET was not acknowledged")

    def get(self, name: str, max_len: int) -> bytes | None:
        v = self._call(lambda: self._r.getrange(name, 0, max_len - 1))
        if not isinstance(v, bytes):
            raise RemoteError(f"GETRANGE answered a {type(v).__name__}")
        return v or None  # a missing key reads as empty (no blob is empty)

    def read_head(self, name: str, head_len: int, max_len: int) -> bytes | None:
        return self.get(name, min(head_len, max_len))

    def exists(self, name: str) -> bool:
        return self.exists_many([name])[0]

    def exists_many(self, names: Sequence[str]) -> list[bool]:
        def run() -> list[Any]:
            p = self._r.pipeline(transaction=False)
            for n in names:
                p.exists(n)
            return list(p.execute())
        res = self._call(run) if names else []
        if len(res) != len(names) or any(type(n) is not int for n in res):
            raise RemoteError(f"EXISTS pipeline answered {str(res)[:80]}")
        return [n > 0 for n in res]

    def health(self) -> None:
        if self._call(lambda: self._r.ping()) is not True:
            raise RemoteError("PING was not answered with PONG")

    def append_record(self, name: str, record: bytes) -> None:
        key, n = manifest.redis_key(name), self.limits.max_records

        def run() -> list[Any]:
            p = self._r.pipeline(transaction=True)  # MULTI ... EXEC: atomic
            p.rpush(key, record)
            p.ltrim(key, -n, -1)
            return list(p.execute())
        res = self._call(run, manifest_op=True)
        if len(res) != 2 or type(res[0]) is not int or res[0] < 1:
            raise RemoteError(f"RPUSH answered {str(res)[:80]}")

    def records(self, name: str) -> list[bytes]:
        n, most = self.limits.max_records, self.limits.max_record_bytes
        v = self._call(lambda: self._r.lrange(manifest.redis_key(name), -n, -1), manifest_op=True)
        if not isinstance(v, list):
            raise CorruptManifest(f"LRANGE answered a {type(v).__name__}")
        return [r for r in v[-n:] if isinstance(r, bytes) and len(r) <= most]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._r.close()


def make_client(url: str, timeout: float, limits: Limits | None = None) -> RemoteClient:
    """Client for ``lm://host:port`` or ``redis://``/``rediss://``/``valkey[s]://`` URLs."""
    u = urlparse(url)
    if u.scheme == "lm":
        if not u.hostname or u.port is None:
            raise ValueError(f"remote url {url!r}: expected lm://host:port")
        return LmClient(u.hostname, u.port, timeout, limits=limits)
    if u.scheme in ("redis", "rediss", "valkey", "valkeys"):
        return RedisClient(url, timeout, limits)
    raise ValueError(f"remote url {url!r}: unsupported scheme {u.scheme!r} "
                     "(lm, redis, rediss, valkey, valkeys; their +cluster forms: see hybrid_connector.tiers.remote.cluster)")
