"""Remote tier: ``lm://host:port`` (LMCache's ``lmcache_server``) or ``redis://`` (Redis,
Valkey).

Each object is one self-describing ``tiers.codec`` blob (key, dtype, shape, checksum;
zstd when ``serde="zstd"``) stored under a name derived from the key digest, so dtype and
shape round-trip bit for bit and a damaged or foreign blob is a miss.

Failure model: every network call runs with a timeout. A failure or timeout marks the
remote down for a backoff period (doubling up to ``max_backoff``) during which calls
return misses / False at once without touching the network; one WARNING is logged when it
goes down and one INFO when it is back. Nothing raises into the caller after
construction (a malformed URL raises ValueError at construction).

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
from typing import TypeVar
from urllib.parse import urlparse

import torch

from hybrid_connector.keys import ObjectKey, ObjectKind
from tiers import codec, lm_protocol
from tiers.tier import Entry, IndexedTier, TierUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")


class RemoteError(Exception):
    """Any failure talking to the remote (wrapped so the guard catches one type)."""


class RemoteClient(ABC):
    """Blob store client. Methods raise RemoteError (or OSError) on any failure."""

    @abstractmethod
    def put(self, name: str, blob: bytes) -> None: ...

    @abstractmethod
    def get(self, name: str) -> bytes | bytearray | None: ...

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
    """Raw-socket client of ``lmcache_server`` (see ``tiers.lm_protocol``). One connection,
    one request at a time; any error closes it and the next call reconnects."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def name_for(self, key: ObjectKey) -> str:
        return lm_protocol.key_string(key.digest())

    def _conn(self) -> socket.socket:
        if self._sock is None:
            s = socket.create_connection((self.host, self.port), timeout=self.timeout)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = s
        return self._sock

    def _recv_exact(self, s: socket.socket, n: int) -> bytearray:
        buf = bytearray(n)
        mv = memoryview(buf)
        got = 0
        while got < n:
            k = s.recv_into(mv[got:])
            if k == 0:
                raise RemoteError("connection closed by the server")
            got += k
        return buf

    def _do(self, fn: Callable[[socket.socket], T]) -> T:
        with self._lock:
            try:
                return fn(self._conn())
            except BaseException:
                self._drop()
                raise

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def _ask(self, s: socket.socket, cmd: lm_protocol.Command, name: str) -> tuple[int, int]:
        s.sendall(lm_protocol.request(cmd, name))
        try:
            return lm_protocol.parse_reply(bytes(self._recv_exact(s, lm_protocol.SERVER.size)))
        except ValueError as exc:
            raise RemoteError(str(exc)) from exc

    def put(self, name: str, blob: bytes) -> None:
        def run(s: socket.socket) -> None:
            s.sendall(lm_protocol.request(lm_protocol.Command.PUT, name, len(blob)))
            s.sendall(blob)
        self._do(run)

    def get(self, name: str) -> bytearray | None:
        def run(s: socket.socket) -> bytearray | None:
            code, length = self._ask(s, lm_protocol.Command.GET, name)
            if code != lm_protocol.SUCCESS:
                return None
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
            self._drop()


class RedisClient(RemoteClient):
    """``redis://`` (or ``valkey://``) via the redis client, no client-side retries (the
    tier's backoff decides when to try again)."""

    def __init__(self, url: str, timeout: float) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._r = redis.Redis.from_url(
            url.replace("valkey://", "redis://", 1), socket_timeout=timeout,
            socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))

    def name_for(self, key: ObjectKey) -> str:
        return "hc:" + key.digest()

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except self._errors as exc:
            raise RemoteError(f"{type(exc).__name__}: {exc}") from exc

    def put(self, name: str, blob: bytes) -> None:
        self._call(lambda: self._r.set(name, blob))

    def get(self, name: str) -> bytes | None:
        v = self._call(lambda: self._r.get(name))
        return None if v is None else bytes(v)  # type: ignore[arg-type]

    def exists(self, name: str) -> bool:
        return bool(self._call(lambda: self._r.exists(name)))

    def delete(self, name: str) -> None:
        self._call(lambda: self._r.delete(name))

    def health(self) -> None:
        self._call(lambda: self._r.ping())

    def close(self) -> None:
        with contextlib.suppress(*self._errors):
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
    """A remote blob store as a tier; see the module docstring and ``tiers.tier.Tier``."""

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
        except (RemoteError, OSError, ValueError) as exc:
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
        blob = codec.encode_blob(key, payload, self.zstd_level)

        def run() -> bool:
            self.client.put(name, blob)
            # lmcache_server does not acknowledge a PUT; confirming keeps "True" honest.
            return self.client.exists(name) if self.confirm_puts else True

        ok, stored = self._guard("put", run)
        return name if ok and stored else None

    def _load_into(self, entry: Entry, out: torch.Tensor) -> bool:
        ok, blob = self._guard("get", lambda: self.client.get(str(entry.handle)))
        if not ok:
            raise TierUnavailable(self.url)  # down or timed out: keep it indexed
        if blob is None:
            return False  # the server lost it (restart, eviction): forget it
        try:
            codec.decode_blob_into(entry.key, blob, out)  # verifies key, shape, dtype, checksum
            return True
        except codec.CorruptObject as exc:
            log.warning("remote tier %s: dropping corrupt %s: %s", self.name, entry.handle, exc)
            return False

    def _release(self, entry: Entry) -> None:
        if not self._key_busy(entry.key):
            self._guard("delete", lambda: self.client.delete(str(entry.handle)))

    def close(self) -> None:
        self.client.close()
