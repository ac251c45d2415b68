"""``MemoryTier``: payload copies in a dict; ``MemoryStore``: a one-tier ``TieredStore`` over
it (ops run inline, so every call returns with the bytes in place). The simplest
``ObjectStore`` for tests and for an index without tiers to move objects between."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.indexed import IndexedTier
from hybrid_connector.tiers.manager import TieredStore
from hybrid_connector.tiers.tier import TierRecord, copy_into


class MemoryTier(IndexedTier):
    """In-process memory with per-kind budgets; ``get`` returns copies."""

    def _store(self, key: ObjectKey, payload: torch.Tensor, token: object) -> object | None:
        return payload.detach().to("cpu", copy=True).contiguous()

    def _load_into(self, entry: TierRecord, out: torch.Tensor) -> bool:
        assert isinstance(entry.handle, torch.Tensor)
        copy_into(out, entry.handle)
        return True

    def _release(self, entry: TierRecord) -> None:
        entry.handle = None


class MemoryStore(TieredStore):
    """A ``TieredStore`` over one ``MemoryTier`` called ``name``."""

    def __init__(self, budgets: Mapping[ObjectKind, int], name: str = "memory") -> None:
        super().__init__([MemoryTier(name, budgets)], inline=True)
