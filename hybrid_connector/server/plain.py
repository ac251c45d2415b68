"""LMCache's plain objects (``lm://`` PUT/GET/EXIST/LIST) in the server's tiers.

An LMCache client addresses an object by its ``CacheEngineKey`` string and expects its
format, dtype and shape echoed on GET. Each becomes one object of the tiered store (same
budgets, LRU demotion across tiers, drops): a KV object, or for our own remote tier's keys
the kind their model field names (``hybrid-connector-state``: the state pool), keyed by a
hash of the string under a per-model fingerprint (``lmc-`` + a hash of the key's model field), its payload prefixed by
a small header carrying the string and the metadata, so a GET returns exactly what was put
(the header's key is compared too: a hash collision is a miss) and a restart over the NVMe
tier serves what it holds. ``LIST`` returns the names put since the server started (the
names of objects adopted at a restart are read back lazily as they are fetched). A name is
remembered only while its object is held: the store reports every object that leaves all
tiers (``Backend.report_dropped``, through the default drop listener: plain fingerprints
have no index attached), and its name is forgotten then, so the names are bounded by what
the tiers hold.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence

import blake3
import numpy as np
import torch

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers import lm_protocol
from hybrid_connector.tiers.store import ObjectStore

_HEAD = struct.Struct("<4s6iH")
_MAGIC = b"LMC1"
Meta = tuple[int, int, int, int, int, int]


def plain_fingerprint(key: str) -> str:
    model = key.split("@", 1)[0]
    return "lmc-" + blake3.blake3(model.encode()).hexdigest(length=6)


def plain_kind(key: str) -> ObjectKind:
    """The pool of a plain object: the kind our own remote tier writes into the key's model
    field (``hybrid_connector.tiers.lm_protocol.kind_model``), KV for LMCache's keys."""
    kind = lm_protocol.kind_of_model(key.split("@", 1)[0])
    return ObjectKind(kind) if kind is not None else ObjectKind.KV


def object_key(key: str) -> ObjectKey:
    return ObjectKey(plain_fingerprint(key), blake3.blake3(key.encode()).digest(length=16),
                     plain_kind(key), 0, 0 if plain_kind(key) is ObjectKind.STATE else 1)


def head_size(key: str) -> int:
    """Bytes of the stored header before the body of an object named ``key``."""
    return _HEAD.size + len(key.encode())


def frame(key: str, meta: Meta, buf: bytearray | np.ndarray) -> torch.Tensor:
    """The stored form in place: ``buf`` holds ``head_size(key)`` free bytes, then the body;
    the header and key are written in front and the whole is one uint8 tensor (no copy)."""
    raw = key.encode()
    arr = np.frombuffer(buf, dtype=np.uint8) if isinstance(buf, bytearray) else buf
    _HEAD.pack_into(arr, 0, _MAGIC, *meta, len(raw))  # type: ignore[arg-type]
    arr[_HEAD.size : _HEAD.size + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return torch.from_numpy(arr)


def pack(key: str, meta: Meta, body: bytes | memoryview) -> torch.Tensor:
    """The stored form: header, key, body (one contiguous uint8 tensor, a copy)."""
    buf = bytearray(head_size(key) + len(body))
    buf[head_size(key):] = body
    return frame(key, meta, buf)


def unpack(stored: torch.Tensor) -> tuple[str, Meta, memoryview] | None:
    """(key, meta, body) of a stored object; None when it is not one of ours."""
    buf = memoryview(stored.contiguous().view(torch.uint8).numpy())  # type: ignore[arg-type]
    if len(buf) < _HEAD.size:
        return None
    magic, *meta, n = _HEAD.unpack_from(buf)
    if magic != _MAGIC or _HEAD.size + n > len(buf):
        return None
    try:
        key = bytes(buf[_HEAD.size : _HEAD.size + n]).decode()
    except UnicodeDecodeError:
        return None
    return key, tuple(meta), buf[_HEAD.size + n :]


class PlainObjects:
    """LMCache's namespace over ``store``. Thread safe (the store is)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._names: dict[ObjectKey, str] = {}
        self._lock = threading.Lock()
        self.puts = self.gets = self.hits = 0
        with store.lock:
            self._chained = store.hooks[None].on_drop  # keep any listener set before us
        store.set_drop_listener(self._dropped)

    def _dropped(self, keys: Sequence[ObjectKey]) -> None:
        """Objects left every tier: forget their names (called with no store lock held)."""
        with self._lock:
            for k in keys:
                self._names.pop(k, None)
        if self._chained is not None:
            self._chained(keys)

    def _remember(self, k: ObjectKey, key: str) -> None:
        """Name ``k`` unless it left the store meanwhile (a drop reported before the name
        was set would otherwise leave it behind forever)."""
        with self._lock:
            if self._names.get(k) == key:
                return  # named already: a drop from now on forgets it
            self._names[k] = key
        if self.store.where([k])[0] is None:
            with self._lock:
                self._names.pop(k, None)

    def put(self, key: str, meta: Meta, body: bytes | memoryview) -> bool:
        return self._put(key, pack(key, meta, body))

    def put_framed(self, key: str, meta: Meta, buf: bytearray | np.ndarray) -> bool:
        """``put`` of a body read into ``buf`` after ``head_size(key)`` free bytes."""
        return self._put(key, frame(key, meta, buf))

    def _put(self, key: str, stored: torch.Tensor) -> bool:
        k = object_key(key)
        ok = self.store.put([(k, stored)])[0]
        with self._lock:
            self.puts += 1
            if not ok:  # an overwrite that did not land removed the old copy unreported
                self._names.pop(k, None)
        if ok:
            self._remember(k, key)
        return ok

    def get(self, key: str) -> tuple[Meta, memoryview] | None:
        k = object_key(key)
        got = self.store.get([k])[0]
        found = unpack(got) if got is not None else None
        with self._lock:
            self.gets += 1
            if found is None or found[0] != key:
                return None
            self.hits += 1
        self._remember(k, key)
        return found[1], found[2]

    def size(self, key: str) -> int | None:
        """Stored bytes of ``key``'s object (its header included: at least its body), None
        when the store holds none. Read without the store's lock (one dict lookup, safe on
        the event loop, never blocked behind a tier op): a hint that can be stale by one
        concurrent PUT or drop, for a reply's room; the reply's real size corrects it."""
        entry = self.store.ledger.entries.get(object_key(key))
        return None if entry is None else int(entry.nbytes)

    def exists(self, key: str) -> bool:
        return self.store.where([object_key(key)])[0] is not None

    def names(self) -> list[str]:
        with self._lock:
            known = list(self._names.items())
        held = self.store.where([k for k, _ in known])
        return sorted(n for (_, n), t in zip(known, held, strict=True) if t is not None)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"puts": self.puts, "gets": self.gets, "hits": self.hits,
                    "names": len(self._names)}
