"""``SizeOnlyStore``: an ``ObjectStore`` (a ``TieredStore`` over one ``SizeOnlyTier``) that
accounts bytes and keeps no data.

For the simulator and the alpha tuners' caches (``runtime.simulator``): payloads are zero-stride views (``zero_payload(n)`` =
``torch.zeros(1, dtype=torch.uint8).expand(n)``), so a "1 GiB" object costs one byte of
memory; the tier records only the key and ``numel() * element_size()``. Kinds are grouped
into pools that share one byte budget (the ledger's ``TierSpec.kind_pool``): one pool
holding KV and STATE reproduces the Marconi simulator's single cache size; one pool per
kind is the deployed per-kind budgets.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from hybrid_connector.core.config import TIERS, HybridConfig
from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.tiers.ledger.ledger import TierSpec
from hybrid_connector.tiers.manager import TieredStore
from hybrid_connector.tiers.tier import Tier, TierStats

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
        """The config's budgets summed over its tiers (the simulator models sizes, not which
        tier an object sits in): one pool per kind, or, when any tier gives KV and states
        one budget (``kv_state``), ``pooled``: KV and states share all their bytes."""
        budgets = [config.budget(t) for t in TIERS]
        if cls.joint(config):
            return cls.pooled(sum(b.total - b.anchor for b in budgets),
                              sum(b.anchor for b in budgets))
        return cls.per_kind({
            k: sum(getattr(b, k.value) for b in budgets) for k in ObjectKind
        })

    @staticmethod
    def joint(config: HybridConfig) -> bool:
        """Does a tier of ``config`` with bytes give KV and states one budget (``kv_state``)?"""
        return any(b.pooled and b.total for b in (config.budget(t) for t in TIERS))

    @property
    def total(self) -> int:
        return sum(self.pools.values())


class SizeOnlyTier(Tier):
    """Remembers sizes, holds no bytes: ``get`` returns zero-stride payloads of the stored
    size. No budget of its own (the ledger's spec enforces the ``Budget``). Not thread safe:
    the simulator is serial."""

    def __init__(self, name: str = "host") -> None:
        self.name = name
        self._sizes: dict[ObjectKey, int] = {}
        self._used = dict.fromkeys(ObjectKind, 0)
        self.peak = dict.fromkeys(ObjectKind, 0)
        self.put_bytes = dict.fromkeys(ObjectKind, 0)  # bytes of every put, cumulative
        self._stats = TierStats(name)

    def capacity(self, kind: ObjectKind) -> int:
        return 1 << 62

    def used(self, kind: ObjectKind) -> int:
        return self._used[kind]

    def contains(self, keys: Sequence[ObjectKey], pin: bool = False) -> list[bool]:
        return [k in self._sizes for k in keys]

    def put(self, items: Sequence[tuple[ObjectKey, torch.Tensor]],
            metas: Sequence[ObjectMeta | None] | None = None) -> list[bool]:
        for key, payload in items:  # sizes only: metadata is not kept
            n = payload.numel() * payload.element_size()
            self._used[key.kind] += n - self._sizes.get(key, 0)
            self._sizes[key] = n
            self.peak[key.kind] = max(self.peak[key.kind], self._used[key.kind])
            self.put_bytes[key.kind] += n
        return [True] * len(items)

    def get_into(self, keys: Sequence[ObjectKey], outs: Sequence[torch.Tensor]) -> list[bool]:
        return [k in self._sizes for k in keys]

    def get(self, keys: Sequence[ObjectKey], device: torch.device | str | None = None
            ) -> list[torch.Tensor | None]:
        return [zero_payload(n) if (n := self._sizes.get(k)) else None for k in keys]

    def meta(self, key: ObjectKey) -> tuple[tuple[int, ...], torch.dtype, int] | None:
        n = self._sizes.get(key)
        return None if n is None else ((n,), torch.uint8, n)

    def pin(self, keys: Sequence[ObjectKey]) -> list[bool]:
        return self.contains(keys)

    def unpin(self, keys: Sequence[ObjectKey]) -> None:
        pass

    def remove(self, keys: Sequence[ObjectKey]) -> list[bool]:
        out = []
        for k in keys:
            n = self._sizes.pop(k, None)
            if n is not None:
                self._used[k.kind] -= n
            out.append(n is not None)
        return out

    def lru(self, kind: ObjectKind) -> Iterator[ObjectKey]:
        return iter([k for k in self._sizes if k.kind is kind])

    def held_keys(self) -> list[ObjectKey]:
        return list(self._sizes)

    def stats(self) -> TierStats:
        return self._stats


class SizeOnlyStore(TieredStore):
    """Byte accounting only over one ``SizeOnlyTier`` (see module docstring); the ledger
    enforces ``budget`` (pooled or per kind). Ops run inline: the sim is serial."""

    keeps_meta = False  # nothing survives a restart here

    def __init__(self, budget: Budget, name: str = "host") -> None:
        for kind, pool in budget.kinds.items():
            if pool not in budget.pools:
                raise ValueError(f"kind {kind.value} uses unknown pool {pool!r}")
        self.budget = budget
        spec = TierSpec(name, {p: int(b) for p, b in budget.pools.items()}, dict(budget.kinds))
        self._tier = SizeOnlyTier(name)
        super().__init__([self._tier], inline=True, promote=False, specs=[spec])

    @staticmethod
    def _valid(payload: torch.Tensor) -> bool:
        return True  # zero-stride payloads are the point: only their size is kept

    @property
    def peak(self) -> dict[ObjectKind, int]:
        """Most bytes held per kind at any point."""
        return self._tier.peak

    @property
    def put_bytes(self) -> dict[ObjectKind, int]:
        """Bytes of every accepted put, per kind, cumulative."""
        return self._tier.put_bytes
