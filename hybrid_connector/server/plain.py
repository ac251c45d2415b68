"""LMCache's plain objects (``lm://`` PUT/GET/EXIST/LIST) in the server's tiers.

An LMCache client addresses an object by its ``CacheEngineKey`` string and expects its
format, dtype and shape echoed on GET. Each becomes one object of the tiered store (same
budgets, LRU demotion across tiers, drops): a KV object, or for our own remote tier's keys
the kind their model field names (``hybrid-connector-state``: the state pool), keyed by a
hash of the string under a per-model fingerprint (``lmc-`` + a hash of the key's model field), its payload prefixed by
a small header carrying the string and the metadata, so a GET returns exactly what was put
(the header's key is compared too: a hash collision is a miss) and a restart over the NVMe
tier serves what it holds. ``LIST`` returns the names put since the server started (the
names of objects adopted at a restart are read back lazily as they are fetched).
"""

from __future__ import annotations

import struct
import threading

import blake3
import numpy as np
import torch

from hybrid_connector.keys import ObjectKey, ObjectKind
from tiers import lm_protocol
from tiers.manager import TierManager

_HEAD = struct.Struct("<4s6iH")
_MAGIC = b"LMC1"
Meta = tuple[int, int, int, int, int, int]


def plain_fingerprint(key: str) -> str:
    model = key.split("@", 1)[0]
    return "lmc-" + blake3.blake3(model.encode()).hexdigest(length=6)


def plain_kind(key: str) -> ObjectKind:
    """The pool of a plain object: the kind our own remote tier writes into the key's model
    field (``tiers.lm_protocol.kind_model``), KV for LMCache's keys."""
    kind = lm_protocol.kind_of_model(key.split("@", 1)[0])
    return ObjectKind(kind) if kind is not None else ObjectKind.KV


def object_key(key: str) -> ObjectKey:
    return ObjectKey(plain_fingerprint(key), blake3.blake3(key.encode()).digest(length=16),
                     plain_kind(key), 0, 0 if plain_kind(key) is ObjectKind.STATE else 1)


def pack(key: str, meta: Meta, body: bytes | memoryview) -> torch.Tensor:
    """The stored form: header, key, body (one contiguous uint8 tensor)."""
    raw = key.encode()
    out = np.empty(_HEAD.size + len(raw) + len(body), dtype=np.uint8)
    _HEAD.pack_into(out, 0,  # type: ignore[arg-type]
                     _MAGIC, *meta, len(raw))
    out[_HEAD.size : _HEAD.size + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    out[_HEAD.size + len(raw) :] = np.frombuffer(body, dtype=np.uint8)
    return torch.from_numpy(out)


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

    def __init__(self, store: TierManager) -> None:
        self.store = store
        self._names: dict[ObjectKey, str] = {}
        self._lock = threading.Lock()
        self.puts = self.gets = self.hits = 0

    def put(self, key: str, meta: Meta, body: bytes | memoryview) -> bool:
        k = object_key(key)
        ok = self.store.put([(k, pack(key, meta, body))])[0]
        with self._lock:
            self.puts += 1
            if ok:
                self._names[k] = key
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
            self._names[k] = key
        return found[1], found[2]

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
