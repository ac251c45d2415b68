"""``MemoryStore``: a single in-process tier with per-kind byte budgets.

The simplest ``ObjectStore``: payload copies in a dict. It never evicts on its own (a put
that does not fit fails), leaving eviction to the cache's policy.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import torch

from hybrid_connector.keys import ObjectKey, ObjectKind
from tiers.store import ObjectStore


class MemoryStore(ObjectStore):
    """In-memory store; thread safe; ``get`` returns clones so stored bytes stay intact."""

    def __init__(self, budgets: Mapping[ObjectKind, int], name: str = "memory") -> None:
        self.name = name
        self._budget = {k: int(budgets.get(k, 0)) for k in ObjectKind}
        self._used = {k: 0 for k in ObjectKind}
        self._data: dict[ObjectKey, torch.Tensor] = {}
        self._lock = threading.Lock()

    def capacity(self, kind: ObjectKind) -> int:
        return self._budget[kind]

    def used(self, kind: ObjectKind) -> int:
        return self._used[kind]

    def put(self, items: Sequence[tuple[ObjectKey, torch.Tensor]]) -> list[bool]:
        out = []
        with self._lock:
            for key, payload in items:
                nbytes = payload.numel() * payload.element_size()
                old = self._data.get(key)
                freed = old.numel() * old.element_size() if old is not None else 0
                if self._used[key.kind] - freed + nbytes > self._budget[key.kind]:
                    out.append(False)
                    continue
                self._data[key] = payload.detach().to("cpu", copy=True).contiguous()
                self._used[key.kind] += nbytes - freed
                out.append(True)
        return out

    def get(self, keys: Sequence[ObjectKey]) -> list[torch.Tensor | None]:
        with self._lock:
            return [t.clone() if (t := self._data.get(k)) is not None else None for k in keys]

    def where(self, keys: Sequence[ObjectKey]) -> list[str | None]:
        with self._lock:
            return [self.name if k in self._data else None for k in keys]

    def keys(self, kind: ObjectKind) -> list[ObjectKey]:
        with self._lock:
            return [k for k in self._data if k.kind is kind]

    def remove(self, keys: Sequence[ObjectKey]) -> None:
        with self._lock:
            for k in keys:
                t = self._data.pop(k, None)
                if t is not None:
                    self._used[k.kind] -= t.numel() * t.element_size()
