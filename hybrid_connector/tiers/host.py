"""Host tier: a slab of host RAM, pinned (page-locked) when CUDA is present so device copies
can run asynchronously; plain pageable memory otherwise (same accounting)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tiers.slab import SlabTier


class HostTier(SlabTier):
    """Objects in one preallocated host slab; see ``SlabTier`` and ``hybrid_connector.tiers.tier.Tier``."""

    def __init__(
        self, budgets: Mapping[ObjectKind, int], name: str = "host", pin_memory: bool | None = None,
        joint: Collection[ObjectKind] = (),
    ) -> None:
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        super().__init__(name, budgets, "cpu", pin_memory=pin_memory, joint=joint)
