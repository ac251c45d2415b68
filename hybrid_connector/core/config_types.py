"""The nested value types of the configuration schema (``config.HybridConfig``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from hybrid_connector.core.sizes import Bytes

__all__ = ["PoolBudget", "Pools", "Strict", "TierReadRates"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PoolBudget(Strict):
    """Byte budgets of one tier, one pool per object kind (0 disables that pool)."""

    kv: Bytes = 0
    state: Bytes = 0
    anchor: Bytes = 0

    @property
    def total(self) -> int:
        return self.kv + self.state + self.anchor


class TierReadRates(Strict):
    """Read bandwidth of each tier in GB/s (10^9 bytes/s) into the engine, for the
    ``tier_eviction: value`` score (defaults: what ``hybrid-connector bench capacity``
    models, ``load_gbps``, plus a 2 GB/s remote store)."""

    device: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 1500.0
    host: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 25.0
    disk: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 6.0
    remote: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 2.0


class Pools(Strict):
    """Per-tier pool budgets. ``None`` means "derive from the LMCache size keys"."""

    device: PoolBudget | None = None
    host: PoolBudget | None = None
    disk: PoolBudget | None = None
    remote: PoolBudget | None = None
