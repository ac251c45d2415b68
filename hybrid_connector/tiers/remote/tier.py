"""Remote tier: ``lm://host:port`` (LMCache's ``lmcache_server``), ``redis://`` (Redis,
Valkey) or ``redis+cluster://`` (a Redis or Valkey Cluster, ``hybrid_connector.tiers.remote.cluster``),
shared by every cache instance (process, machine) that points at the server.

Each object is one self-describing ``hybrid_connector.tiers.codec`` blob (key, dtype, shape, checksum;
zstd when ``serde="zstd"``) stored under a name derived from the key digest, so dtype and
shape round-trip bit for bit, any instance can read any other's objects, and a damaged or
foreign blob is a miss. Clients live in ``hybrid_connector.tiers.remote.clients``, the backoff in
``hybrid_connector.tiers.remote.guard``, the manifest API in ``hybrid_connector.tiers.remote.manifests``.

What this process knows, and what it asks the server:

* The index (and so the budget, ``lru``, ``held_keys``) covers the objects this process
  put. It is a cache of the server: ``contains`` and reads trust it; a read that finds the
  object gone or corrupt forgets it.
* A key it does not index is asked of the server (``contains``: one pipelined EXISTS
  batch; ``meta``: a header read; ``get``/``get_into``: the blob), within the call's
  deadline. Keys the server confirmed are remembered (``max_seen`` of them, outside the
  budget) until a read finds them gone or corrupt, or ``remove``. Such objects are read
  like our own, with dtype and shape from the blob's header; they are not pinned (this
  tier never deletes a shared object, so a pin has nothing to protect) and not listed by
  ``lru``/``held_keys``. A kind whose budget here is 0 is never asked about.
* A blob found corrupt is quarantined for ``quarantine_s`` seconds (or until this process
  puts that key): the server still claims it, but it is not claimed again meanwhile.
* ``remove`` only forgets: a shared object is never deleted from the server (other
  instances may be reading it; ``lmcache_server`` has no delete anyway), so a later
  ``contains`` may find it there again like any other instance's object.
* Manifests (``append_record``/``records``): small named lists of records that let other
  instances find objects without knowing their keys; see ``hybrid_connector.tiers.manifest``.

Failure model: every client call runs under one deadline, ``timeout`` seconds for the
whole call (connect, send and every receive of the reply together; see
``hybrid_connector.tiers.deadline``). Calls never wait for each other: each in-flight call has a connection
of its own. A reply longer than the object's bound (``codec.max_blob_len`` of its size,
or of the kind's budget for an object of unknown size) is refused before anything is
allocated. Any failure at all (timeout, I/O error, protocol violation, a malformed or
hostile blob, an exception out of a client library) is a miss / False / []. A network
failure also marks the remote down for a backoff period (doubling up to ``max_backoff``)
during which calls return misses at once without touching the network; one WARNING is
logged when it goes down and one INFO when it is back. Nothing raises into the caller
after construction except ValueError for a malformed manifest name or record type.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import torch

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers import codec
from hybrid_connector.tiers.indexed import IndexedTier
from hybrid_connector.tiers.manifest import Limits
from hybrid_connector.tiers.remote.clients import (
    LmClient,
    RedisClient,
    RemoteClient,
    RemoteError,
    ReplyTooLarge,
    ShardUnavailable,
)
from hybrid_connector.tiers.remote.cluster import CHUNK_SIZE, make_client
from hybrid_connector.tiers.remote.guard import Guard
from hybrid_connector.tiers.remote.manifests import REFUSED, ManifestAccess
from hybrid_connector.tiers.tier import TierRecord, TierUnavailable, nbytes_of

__all__ = ["LmClient", "RedisClient", "RemoteClient", "RemoteError", "RemoteTier",
           "ReplyTooLarge", "ShardUnavailable", "make_client"]

log = logging.getLogger(__name__)
T = TypeVar("T")
Meta = tuple[tuple[int, ...], torch.dtype, int]


class RemoteTier(ManifestAccess, IndexedTier):
    """A remote blob store as a tier; see the module docstring and ``hybrid_connector.tiers.tier.Tier``.

    ``timeout``: the one deadline of each client call in seconds (config key
    ``remote_timeout_s``), covering connect, send and the whole reply; a put that confirms
    (``confirm_puts``) makes two calls. ``client`` replaces the URL's client (tests).
    ``limits`` bound manifests; ``chunk_size``: the largest value one command moves on a
    cluster (bigger objects are chunked, ``hybrid_connector.tiers.remote.chunks``). Shared: the ledger writes copies to it and never deletes
    from it.
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
        limits: Limits | None = None,
        max_seen: int = 1 << 16,
        quarantine_s: float = 300.0,
        chunk_size: int = CHUNK_SIZE,
    ) -> None:
        super().__init__(name, budgets)
        if serde not in ("naive", "zstd"):
            raise ValueError(f"remote serde {serde!r}: expected 'naive' or 'zstd'")
        self.url = url
        self.limits = limits or Limits()
        self.client = client if client is not None else make_client(
            url, timeout, self.limits, chunk_size,
            max_len=codec.max_blob_len(max(budgets.values(), default=0)))  # bounds old chunks
        self.zstd_level = zstd_level if serde == "zstd" else None
        self.confirm_puts = confirm_puts
        self._g = Guard(log, f"remote tier {name} ({url})", min_backoff, max_backoff,
                        self._count_error, partial=(ShardUnavailable,))
        # Keys the server confirmed that this process did not put -> their meta, once read.
        self._seen: OrderedDict[ObjectKey, Meta | None] = OrderedDict()
        self._quarantine: OrderedDict[ObjectKey, float] = OrderedDict()  # key -> until
        self.max_seen, self.quarantine_s = max_seen, quarantine_s

    # ------------------------------------------------------------------ guard
    @property
    def is_down(self) -> bool:
        return self._g.is_down

    @property
    def failures(self) -> int:
        return self._g.failures

    def _count_error(self) -> None:
        with self._lock:
            self._stats.errors += 1

    def _guard(self, what: str, fn: Callable[[], T]) -> tuple[bool, T | None]:
        """(ok, result) of ``fn``; failures mark the remote down with backoff."""
        return self._g.run(what, fn)

    def healthy(self) -> bool:
        """One health round trip (through the guard)."""
        return self._guard("health", self.client.health)[0]

    # ------------------------------------------------------------------ what is known
    def _indexed(self, key: ObjectKey) -> bool:
        with self._lock:
            return self._entry(key) is not None

    def _askable(self, key: ObjectKey, now: float) -> bool:
        """Whether the server may be asked about ``key`` (under the lock)."""
        until = self._quarantine.get(key)
        if until is not None and now >= until:
            del self._quarantine[key]
            until = None
        return until is None and self._budget[key.kind] > 0

    def _remember(self, key: ObjectKey, meta: Meta | None) -> None:
        with self._lock:
            if meta is None:
                meta = self._seen.get(key)
            self._seen[key] = meta
            self._seen.move_to_end(key)
            while len(self._seen) > self.max_seen:
                self._seen.popitem(last=False)

    def _forget(self, key: ObjectKey, corrupt: bool = False) -> None:
        with self._lock:
            self._seen.pop(key, None)
            if corrupt:
                self._quarantine[key] = time.monotonic() + self.quarantine_s
                self._quarantine.move_to_end(key)
                while len(self._quarantine) > self.max_seen:
                    self._quarantine.popitem(last=False)

    def contains(self, keys: Sequence[ObjectKey], pin: bool = False) -> list[bool]:
        """Indexed keys (pinned with ``pin``) and keys seen on the server are answered
        locally; the rest are asked of the server in one batch, within one deadline. An
        unreachable server answers False (not known now). Server-only keys are not pinned."""
        out = super().contains(keys, pin)
        ask: list[int] = []
        with self._lock:
            now = time.monotonic()
            for i, k in enumerate(keys):
                if out[i]:
                    continue
                if k in self._seen:
                    out[i] = True
                    self._seen.move_to_end(k)
                elif self._askable(k, now):
                    ask.append(i)
        if ask:
            names = [self.client.name_for(keys[i]) for i in ask]
            ok, found = self._guard("exists", lambda: self.client.exists_many(names))
            if ok and found is not None:
                for i, there in zip(ask, found, strict=True):
                    if there:
                        self._remember(keys[i], None)
                        out[i] = True
        return out

    def meta(self, key: ObjectKey) -> Meta | None:
        """``(shape, dtype, nbytes)`` of an indexed object, else from the blob's header on
        the server (a range read where the store has one; None when it is absent,
        unreadable or unreachable)."""
        m = super().meta(key)
        if m is not None:
            return m
        with self._lock:
            m = self._seen.get(key)
            if m is not None or not self._askable(key, time.monotonic()):
                return m
        bound = codec.max_blob_len(self._budget[key.kind])
        head = codec.PREFIX.size + codec.MAX_HEADER
        got = self._fetch(key, lambda name: self.client.read_head(name, head, bound))
        if got is None:
            return None
        try:
            h = self._header(key, got)[0]
        except codec.CorruptObject as exc:
            self._corrupt(key, exc)
            return None
        if h.nbytes > self._budget[key.kind]:
            return None  # bigger than this tier stores: not for us (another's budget)
        m = (h.shape, h.torch_dtype, h.nbytes)
        self._remember(key, m)
        return m

    # ------------------------------------------------------------------ reads of others' objects
    def _fetch(self, key: ObjectKey, read: Callable[[str], bytes | bytearray | None]
               ) -> bytes | bytearray | None:
        """The server's blob (or head) of an unindexed ``key``; None on any failure. Gone:
        forgotten; a reply over the bound: a miss that does not mark the remote down."""
        name = self.client.name_for(key)

        def run() -> bytes | bytearray | object | None:
            try:
                return read(name)
            except ReplyTooLarge:
                return REFUSED
        ok, blob = self._guard("get", run)
        if ok and blob is None:
            self._forget(key)  # the server does not have it (any more)
        if not ok or not isinstance(blob, bytes | bytearray):
            return None
        return blob

    def _header(self, key: ObjectKey, blob: bytes | bytearray) -> tuple[codec.Header, memoryview]:
        """(header, body) of ``blob`` (or of its head): a valid header of ``key``'s object,
        else CorruptObject. The body may be short (a head, or a read cut at a bound)."""
        mv = memoryview(blob)
        hlen, hcrc = codec.decode_prefix(bytes(mv[: codec.PREFIX.size]))
        h = codec.decode_header(bytes(mv[codec.PREFIX.size : codec.PREFIX.size + hlen]), hcrc)
        if h.key != key.to_str():
            raise codec.CorruptObject("blob belongs to another key")
        return h, mv[codec.PREFIX.size + hlen :]

    def _corrupt(self, key: ObjectKey, exc: Exception) -> None:
        log.warning("remote tier %s: ignoring corrupt %s: %s", self.name,
                    self.client.name_for(key), exc)
        with self._lock:
            self._stats.errors += 1
        self._forget(key, corrupt=True)

    def _read_unindexed(self, key: ObjectKey, out: torch.Tensor | None,
                        device: torch.device | str | None) -> torch.Tensor | None:
        """Read an object this process did not put into ``out`` (or a new tensor on
        ``device``, sized by the blob's header); None on any failure."""
        with self._lock:
            known = self._seen.get(key)
            askable = self._askable(key, time.monotonic())
        if not askable:
            with self._lock:
                self._stats.misses += 1
            return None
        size = nbytes_of(out) if out is not None else known[2] if known else self._budget[key.kind]
        bound = codec.max_blob_len(min(size, self._budget[key.kind]))
        blob = self._fetch(key, lambda name: self.client.get(name, bound))
        if blob is None:
            with self._lock:
                self._stats.misses += 1
            return None
        try:
            h, body = self._header(key, blob)
            dtype = h.torch_dtype
            # Checked before the body's length: a read bounded by a wrong buffer's size
            # (or by the budget) is cut short without the blob being damaged.
            if (h.nbytes > self._budget[key.kind] or out is not None and (
                    tuple(out.shape) != h.shape or out.dtype != dtype or not out.is_contiguous())):
                with self._lock:
                    self._stats.errors += 1  # the caller's buffer or budget, not the blob
                return None
            if len(body) != h.stored:
                raise codec.CorruptObject("truncated body")
            codec.check_frame(h, body)  # a zstd frame must declare nbytes before we decode
            dst = out if out is not None else torch.empty(h.shape, dtype=dtype, device=device or "cpu")
            codec.decode_into(h, body, dst)
        except codec.CorruptObject as exc:
            self._corrupt(key, exc)
            return None
        except Exception as exc:  # e.g. the copy into a device buffer: the blob may be fine
            log.warning("remote tier %s: cannot load %s: %s", self.name, self.client.name_for(key), exc)
            with self._lock:
                self._stats.errors += 1
            return None
        self._remember(key, (h.shape, dtype, h.nbytes))
        with self._lock:
            self._stats.hits += 1
            self._stats.bytes_read += h.nbytes
        return dst

    def _get_one(self, key: ObjectKey, out: torch.Tensor) -> bool:
        if self._indexed(key):
            return super()._get_one(key, out)
        return self._read_unindexed(key, out, None) is not None

    def get(self, keys: Sequence[ObjectKey], device: torch.device | str | None = None
            ) -> list[torch.Tensor | None]:
        """As ``Tier.get``; an object this process did not put is read in one round trip
        (dtype and shape from its header)."""
        return [super(RemoteTier, self).get([k], device)[0] if self._indexed(k)
                else self._read_unindexed(k, None, device) for k in keys]

    def remove(self, keys: Sequence[ObjectKey]) -> list[bool]:
        """Forget each key locally (False: not known here). Nothing is deleted from the
        server: other instances keep reading it, and so may this one after ``contains``."""
        out = super().remove(keys)
        with self._lock:
            for i, k in enumerate(keys):
                if k in self._seen:
                    del self._seen[k]
                    out[i] = True
        return out

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
        if not (ok and stored):
            return None
        with self._lock:  # ours now: indexed, and a good copy whatever was quarantined
            self._seen.pop(key, None)
            self._quarantine.pop(key, None)
        return name

    def _load_into(self, entry: TierRecord, out: torch.Tensor) -> bool:
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
            self._forget(entry.key, corrupt=True)  # the server still claims it: don't believe it
            return False
        except Exception as exc:  # e.g. the copy into a device buffer: the blob may be fine
            log.warning("remote tier %s: cannot load %s: %s", self.name, entry.handle, exc)
            raise TierUnavailable(self.url) from exc

    def _release(self, entry: TierRecord) -> None:
        """Nothing to free: a shared object is never deleted from the server."""

    def close(self) -> None:
        self.client.close()
