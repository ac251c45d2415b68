"""Device tier: a slab on the engine's device (GPU HBM when CUDA is available, else plain
CPU memory with exactly the same accounting, so the tiering logic is testable anywhere)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tiers.slab import SlabTier


def default_device() -> torch.device:
    """The engine's device: the current CUDA device when there is one, else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class DeviceTier(SlabTier):
    """Objects in one preallocated device slab; see ``SlabTier`` and ``hybrid_connector.tiers.tier.Tier``."""

    def __init__(
        self,
        budgets: Mapping[ObjectKind, int],
        name: str = "device",
        device: torch.device | str | None = None,
        joint: Collection[ObjectKind] = (),
    ) -> None:
        super().__init__(name, budgets, device if device is not None else default_device(),
                         joint=joint)
