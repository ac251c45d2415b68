"""``SizeOnlyStore``: an ``ObjectStore`` that accounts bytes and keeps no data.

For the simulator: payloads are zero-stride views (``zero_payload(n)`` =
``torch.zeros(1, dtype=torch.uint8).expand(n)``), so a "1 GiB" object costs one byte of
memory; ``put`` records only the key and ``numel() * element_size()``. Kinds are grouped
into pools that share one byte budget: ``capacity(kind)`` is the pool budget minus what the
pool's *other* kinds use, so the cache's check ``used(kind) + n > capacity(kind)`` is
exactly "the pool would overflow". One pool holding KV and STATE reproduces the Marconi
simulator's single cache size; one pool per kind is the deployed per-kind budgets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from hybrid_connector.config import TIERS, HybridConfig
from hybrid_connector.keys import ObjectKey, ObjectKind
from tiers.store import ObjectStore

_ONE = torch.zeros(1, dtype=torch.uint8)


def zero_payload(nbytes: int) -> torch.Tensor:
    """A tensor that reports ``nbytes`` bytes and owns one (stride 0, never copy it)."""
    if nbytes <= 0:
        raise ValueError(f"payload size must be positive, got {nbytes}")
    return _ONE.expand(nbytes)


@dataclass(frozen=True)
class Budget:
    """Byte budgets by pool and which pool each kind uses (a kind with no pool: 0 bytes)."""

    pools: Mapping[str, int]
    kinds: Mapping[ObjectKind, str]

    @classmethod
    def pooled(cls, total: int, anchor: int = 0) -> Budget:
        """KV and states share ``total``; anchors get their own ``anchor`` bytes."""
        kinds = {ObjectKind.KV: "main", ObjectKind.STATE: "main", ObjectKind.ANCHOR: "anchor"}
        return cls({"main": int(total), "anchor": int(anchor)}, kinds)

    @classmethod
    def per_kind(cls, sizes: Mapping[ObjectKind, int]) -> Budget:
        return cls({k.value: int(v) for k, v in sizes.items()}, {k: k.value for k in sizes})

    @classmethod
    def from_config(cls, config: HybridConfig) -> Budget:
        """One pool per kind holding the config's budget for that kind summed over its
        tiers: the ``capacity(kind)`` a ``TierManager`` built from it gives the cache (the
        simulator models sizes, not which tier an object sits in)."""
        return cls.per_kind({
            k: sum(getattr(config.budget(t), k.value) for t in TIERS) for k in ObjectKind
        })

    @property
    def total(self) -> int:
        return sum(self.pools.values())


class SizeOnlyStore(ObjectStore):
    """Byte accounting only (see module docstring). Not thread safe; the sim is serial."""

    def __init__(self, budget: Budget, name: str = "host") -> None:
        for kind, pool in budget.kinds.items():
            if pool not in budget.pools:
                raise ValueError(f"kind {kind.value} uses unknown pool {pool!r}")
        self.budget = budget
        self.name = name
        self._sizes: dict[ObjectKey, int] = {}
        self._used = {k: 0 for k in ObjectKind}
        self.peak = {k: 0 for k in ObjectKind}
        self.put_bytes = {k: 0 for k in ObjectKind}  # bytes of every accepted put, cumulative

    def _pool_budget(self, kind: ObjectKind) -> int:
        pool = self.budget.kinds.get(kind)
        return int(self.budget.pools[pool]) if pool is not None else 0

    def capacity(self, kind: ObjectKind) -> int:
        pool = self.budget.kinds.get(kind)
        if pool is None:
            return 0
        others = sum(
            self._used[k] for k, p in self.budget.kinds.items() if p == pool and k is not kind
        )
        return max(0, self._pool_budget(kind) - others)

    def used(self, kind: ObjectKind) -> int:
        return self._used[kind]

    def max_object_bytes(self, kind: ObjectKind) -> int:
        return self._pool_budget(kind)

    def room_kinds(self, kind: ObjectKind) -> tuple[ObjectKind, ...]:
        pool = self.budget.kinds.get(kind)
        return (kind, *(k for k, p in self.budget.kinds.items() if p == pool and k is not kind))

    def fits(self, pending: Mapping[ObjectKind, int]) -> bool:
        """Per pool: what its kinds use plus what is pending must fit its budget."""
        need: dict[str, int] = {}
        for kind, n in pending.items():
            if n:
                pool = self.budget.kinds.get(kind)
                if pool is None:
                    return False
                need[pool] = need.get(pool, 0) + n
        return all(
            sum(self._used[k] for k, p in self.budget.kinds.items() if p == pool) + n
            <= int(self.budget.pools[pool])
            for pool, n in need.items()
        )

    def put(self, items: Sequence[tuple[ObjectKey, torch.Tensor]]) -> list[bool]:
        out = []
        for key, payload in items:
            nbytes = payload.numel() * payload.element_size()
            old = self._sizes.get(key, 0)
            if self._used[key.kind] - old + nbytes > self.capacity(key.kind):
                out.append(False)
                continue
            self._sizes[key] = nbytes
            self._used[key.kind] += nbytes - old
            self.peak[key.kind] = max(self.peak[key.kind], self._used[key.kind])
            self.put_bytes[key.kind] += nbytes
            out.append(True)
        return out

    def get(self, keys: Sequence[ObjectKey]) -> list[torch.Tensor | None]:
        return [zero_payload(n) if (n := self._sizes.get(k)) else None for k in keys]

    def where(self, keys: Sequence[ObjectKey]) -> list[str | None]:
        return [self.name if k in self._sizes else None for k in keys]

    def keys(self, kind: ObjectKind) -> list[ObjectKey]:
        return [k for k in self._sizes if k.kind is kind]

    def remove(self, keys: Sequence[ObjectKey]) -> None:
        for k in keys:
            n = self._sizes.pop(k, None)
            if n is not None:
                self._used[k.kind] -= n
