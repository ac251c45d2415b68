"""Remote tier: ``lm://host:port`` (LMCache's ``lmcache_server``) or ``redis://`` (Redis,
Valkey).

Each object is one self-describing ``tiers.codec`` blob (key, dtype, shape, checksum;
zstd when ``serde="zstd"``) stored under a name derived from the key digest, so dtype and
shape round-trip bit for bit and a damaged or foreign blob is a miss.

Failure model: every client call runs under one deadline, ``timeout`` seconds for the
whole call (connect, send and every receive of the reply together; see
``tiers.deadline``), so a server that trickles its reply cannot stretch it. Calls never
wait for each other: each in-flight call has a connection of its own (a small pool of
idle ones is kept), so one slow call does not block other threads. A reply longer than
the object's bound (``codec.max_blob_len`` of its size) is refused before anything is
allocated. Any failure at all (timeout, I/O error, protocol violation, a malformed or
hostile blob, an exception out of a client library) is a miss / False. A network failure
also marks the remote down for a backoff period (doubling up to ``max_backoff``) during
which calls return misses / False at once without touching the network; one WARNING is
logged when it goes down and one INFO when it is back. Nothing raises into the caller
after construction (a malformed URL raises ValueError at construction).

The index (and so the budget) covers the objects this process put. ``lmcache_server`` has
no delete command, so removing an object there only forgets it locally (the server keeps
the bytes until it restarts); Redis objects are deleted.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlparse

import torch

from hybrid_connector.keys import ObjectKey, ObjectKind
from tiers import codec, deadline, lm_protocol
from tiers.deadline import DeadlineSocket
from tiers.indexed import IndexedTier
from tiers.tier import Entry, TierUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")


class RemoteError(Exception):
    """A failure talking to the remote: a protocol violation, a refused reply, or any
    exception out of a client library (wrapped with its type and message)."""


class RemoteClient(ABC):
    """Blob store client. Every method is one call under one deadline and raises
    RemoteError (or OSError) on any failure; calls from several threads run concurrently."""

    @abstractmethod
    def put(self, name: str, blob: bytes) -> None: ...

    @abstractmethod
    def get(self, name: str, max_len: int) -> bytes | bytearray | None:
        """The blob (None: not stored). A blob longer than ``max_len`` is an error,
        detected before anything that size is allocated."""

    @abstractmethod
    def exists(self, name: str) -> bool: ...

    @abstractmethod
    def delete(self, name: str) -> None: ...

    @abstractmethod
    def health(self) -> None: ...

    def name_for(self, key: ObjectKey) -> str:
        return key.digest()

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class LmClient(RemoteClient):
    """Raw-socket client of ``lmcache_server`` (see ``tiers.lm_protocol``).

    Each call runs under one deadline of ``timeout`` seconds (connect, send and every
    receive) on a connection of its own: an idle pooled one or a new one. It goes back to
    the pool (at most ``max_idle`` are kept) only after a clean exchange; any error closes
    it. No lock is held during I/O, so a slow call never delays another thread's call
    (``lmcache_server`` serves each connection in its own thread)."""

    def __init__(self, host: str, port: int, timeout: float, max_idle: int = 4) -> None:
        self.host, self.port, self.timeout, self.max_idle = host, port, timeout, max_idle
        self._idle: list[DeadlineSocket] = []
        self._lock = threading.Lock()  # guards _idle only
        self._closed = False

    def name_for(self, key: ObjectKey) -> str:
        return lm_protocol.key_string(key.digest())

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

    def _ask(self, s: DeadlineSocket, cmd: lm_protocol.Command, name: str) -> tuple[int, int]:
        s.sendall(lm_protocol.request(cmd, name))
        try:
            return lm_protocol.parse_reply(bytes(self._recv_exact(s, lm_protocol.SERVER.size)))
        except ValueError as exc:
            raise RemoteError(str(exc)) from exc

    def put(self, name: str, blob: bytes) -> None:
        def run(s: DeadlineSocket) -> None:
            s.sendall(lm_protocol.request(lm_protocol.Command.PUT, name, len(blob)))
            s.sendall(blob)
        self._do(run)

    def get(self, name: str, max_len: int) -> bytearray | None:
        def run(s: DeadlineSocket) -> bytearray | None:
            code, length = self._ask(s, lm_protocol.Command.GET, name)
            if code != lm_protocol.SUCCESS:
                if length:
                    raise RemoteError(f"a miss announcing {length} bytes")
                return None
            if length > max_len:  # checked before the buffer is allocated
                raise RemoteError(f"reply of {length} bytes exceeds the bound {max_len}")
            return self._recv_exact(s, length)
        return self._do(run)

    def exists(self, name: str) -> bool:
        return self._do(lambda s: self._ask(s, lm_protocol.Command.EXIST, name)[0]) == lm_protocol.SUCCESS

    def delete(self, name: str) -> None:
        pass  # lmcache_server has no delete command

    def health(self) -> None:
        if self._do(lambda s: self._ask(s, lm_protocol.Command.HEALTH, "x@1@0@0@uint8"))[0] != lm_protocol.SUCCESS:
            raise RemoteError("health check failed")

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
    """``redis://``, ``rediss://`` or ``valkey://`` via redis-py, speaking RESP2 (no
    ``HELLO`` handshake, which Redis-likes answer in odd ways) with no client-side retries
    (the tier's backoff decides when to try again). redis-py's pool gives each in-flight
    call a connection of its own; each call runs under one deadline of ``timeout`` seconds
    that its connect, handshake, send and every receive share. Reads are
    ``GETRANGE 0 max_len-1``, so a server never has reason to send more than the bound.
    Any exception out of redis-py is a RemoteError."""

    def __init__(self, url: str, timeout: float) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.timeout = timeout
        base = redis.SSLConnection if url.startswith("rediss://") else redis.Connection
        self._r = redis.Redis.from_url(
            url.replace("valkey://", "redis://", 1), socket_timeout=timeout,
            socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0), protocol=2,
            connection_class=type("DeadlineConnection", (_DeadlineConnection, base), {}))

    def name_for(self, key: ObjectKey) -> str:
        return "hc:" + key.digest()

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            with deadline.scope(self.timeout):
                return fn()
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

    def exists(self, name: str) -> bool:
        n = self._call(lambda: self._r.exists(name))
        if type(n) is not int:
            raise RemoteError(f"EXISTS answered a {type(n).__name__}")
        return n > 0

    def delete(self, name: str) -> None:
        self._call(lambda: self._r.delete(name))

    def health(self) -> None:
        if self._call(lambda: self._r.ping()) is not True:
            raise RemoteError("PING was not answered with PONG")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._r.close()


def make_client(url: str, timeout: float) -> RemoteClient:
    """Client for ``lm://host:port`` or ``redis://``/``rediss://``/``valkey://`` URLs."""
    u = urlparse(url)
    if u.scheme == "lm":
        if not u.hostname or u.port is None:
            raise ValueError(f"remote url {url!r}: expected lm://host:port")
        return LmClient(u.hostname, u.port, timeout)
    if u.scheme in ("redis", "rediss", "valkey"):
        return RedisClient(url, timeout)
    raise ValueError(f"remote url {url!r}: unsupported scheme {u.scheme!r} (lm, redis, valkey)")


class RemoteTier(IndexedTier):
    """A remote blob store as a tier; see the module docstring and ``tiers.tier.Tier``.

    ``timeout``: the one deadline of each client call in seconds (config key
    ``remote_timeout_s``), covering connect, send and the whole reply; a put that confirms
    (``confirm_puts``) makes two calls. ``client`` replaces the URL's client (tests).
    Shared: other instances read and write the same server, so the ledger writes copies
    to it and never deletes from it.
    """

    slow = True
    shared = True

    def __init__(
        self,
        url: str,
        budgets: Mapping[ObjectKind, int],
        name: str = "remote",
        serde: str = "naive",
        zstd_level: int = 3,
        timeout: float = 1.0,
        min_backoff: float = 0.5,
        max_backoff: float = 30.0,
        confirm_puts: bool = True,
        client: RemoteClient | None = None,
    ) -> None:
        super().__init__(name, budgets)
        if serde not in ("naive", "zstd"):
            raise ValueError(f"remote serde {serde!r}: expected 'naive' or 'zstd'")
        self.url = url
        self.client = client if client is not None else make_client(url, timeout)
        self.zstd_level = zstd_level if serde == "zstd" else None
        self.confirm_puts = confirm_puts
        self.min_backoff, self.max_backoff = min_backoff, max_backoff
        self._backoff = min_backoff
        self._down_until = 0.0
        self._down = False
        self._state_lock = threading.Lock()
        self.failures = 0

    # ------------------------------------------------------------------ guard
    @property
    def is_down(self) -> bool:
        return self._down and time.monotonic() < self._down_until

    def _guard(self, what: str, fn: Callable[[], T]) -> tuple[bool, T | None]:
        """(ok, result) of ``fn``; failures mark the remote down with backoff."""
        with self._state_lock:
            if self._down and time.monotonic() < self._down_until:
                return False, None
        try:
            out = fn()
        except Exception as exc:  # every remote failure is a miss, whatever raised it
            with self._state_lock:
                self.failures += 1
                self._stats.errors += 1
                if not self._down:
                    log.warning("remote tier %s (%s) down: %s failed: %s; treating as misses, "
                                "retrying with backoff", self.name, self.url, what, exc)
                self._down_until = time.monotonic() + self._backoff
                self._backoff = min(self._backoff * 2, self.max_backoff)
                self._down = True
            return False, None
        with self._state_lock:
            if self._down:
                log.info("remote tier %s (%s) is back", self.name, self.url)
            self._down = False
            self._backoff = self.min_backoff
        return True, out

    def healthy(self) -> bool:
        """One health round trip (through the guard)."""
        return self._guard("health", self.client.health)[0]

    # ------------------------------------------------------------------ storage
    def _store(self, key: ObjectKey, payload: torch.Tensor, token: object) -> object | None:
        name = self.client.name_for(key)
        try:
            blob = codec.encode_blob(key, payload, self.zstd_level)
        except Exception as exc:  # e.g. MemoryError: a local failure, not the remote's
            log.warning("remote tier %s: cannot encode %s: %s", self.name, name, exc)
            return None

        def run() -> bool:
            self.client.put(name, blob)
            # lmcache_server does not acknowledge a PUT; confirming keeps "True" honest.
            return self.client.exists(name) if self.confirm_puts else True

        ok, stored = self._guard("put", run)
        return name if ok and stored else None

    def _load_into(self, entry: Entry, out: torch.Tensor) -> bool:
        # The most a valid blob of this object can take: a longer reply is refused unread.
        bound = codec.max_blob_len(entry.nbytes)
        ok, blob = self._guard("get", lambda: self.client.get(str(entry.handle), bound))
        if not ok:
            raise TierUnavailable(self.url)  # down, timed out or refused: keep it indexed
        if blob is None:
            return False  # the server lost it (restart, eviction): forget it
        try:
            codec.decode_blob_into(entry.key, blob, out)  # verifies key, shape, dtype, checksum
            return True
        except codec.CorruptObject as exc:
            log.warning("remote tier %s: dropping corrupt %s: %s", self.name, entry.handle, exc)
            return False
        except Exception as exc:  # e.g. the copy into a device buffer: the blob may be fine
            log.warning("remote tier %s: cannot load %s: %s", self.name, entry.handle, exc)
            raise TierUnavailable(self.url) from exc

    def _release(self, entry: Entry) -> None:
        if not self._key_busy(entry.key):
            self._guard("delete", lambda: self.client.delete(str(entry.handle)))

    def close(self) -> None:
        self.client.close()
