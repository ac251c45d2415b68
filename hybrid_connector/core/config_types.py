"""The nested value types of the configuration schema (``config.HybridConfig``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hybrid_connector.core.sizes import Bytes

__all__ = ["DEFAULT_SPLIT", "POOLED_TIERS", "PoolBudget", "Pools", "Strict", "TierReadRates"]

POOLED_TIERS = ("device", "host", "disk")  # KV and states may share a budget there
# Default split of a tier's total when only its size key is given: device and host give KV
# and states one shared budget (the split follows the workload), disk one pool per kind.
POOLED_BY_DEFAULT = ("device", "host")
DEFAULT_SPLIT = {"kv_state": 0.9, "anchor": 0.1}
DEFAULT_SPLIT_PER_KIND = {"kv": 0.6, "state": 0.3, "anchor": 0.1}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PoolBudget(Strict):
    """Byte budgets of one tier: one pool per object kind (0 disables that pool), or, with
    ``kv_state``, one budget KV and states share (each kind takes what the other leaves;
    together they never exceed it) next to the anchors' own ``anchor`` pool. ``kv_state``
    and ``kv``/``state`` together are contradictory (a ``ValueError`` naming them)."""

    kv: Bytes = 0
    state: Bytes = 0
    kv_state: Bytes | None = None
    anchor: Bytes = 0

    @model_validator(mode="after")
    def _one_form(self) -> PoolBudget:
        both = [k for k in ("kv", "state") if k in self.model_fields_set]
        if self.kv_state is not None and both:
            raise ValueError(f"kv_state (one budget KV and states share) and {' and '.join(both)} "
                             "are both set: give either kv_state or kv and state")
        return self

    @property
    def pooled(self) -> bool:
        """KV and states share one budget (``kv_state``)."""
        return self.kv_state is not None

    @property
    def total(self) -> int:
        return (self.kv_state or 0) + self.kv + self.state + self.anchor

    @classmethod
    def split(cls, tier: str, total: int) -> PoolBudget:
        """``tier``'s budget from its size key alone (``DEFAULT_SPLIT`` or, where KV and
        states cannot share, ``DEFAULT_SPLIT_PER_KIND``)."""
        split = DEFAULT_SPLIT if tier in POOLED_BY_DEFAULT else DEFAULT_SPLIT_PER_KIND
        return cls(**{k: int(total * f) for k, f in split.items()})

    def kinds(self) -> dict[str, int]:
        """The most bytes each kind may take (kind name -> bytes): with ``kv_state``, KV and
        states may each take all of it (their sum is bounded by it too)."""
        if self.kv_state is not None:
            return {"kv": self.kv_state, "state": self.kv_state, "anchor": self.anchor}
        return {"kv": self.kv, "state": self.state, "anchor": self.anchor}


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

    @model_validator(mode="after")
    def _pooled_tiers(self) -> Pools:
        for name in (n for n in type(self).model_fields if n not in POOLED_TIERS):
            pool: PoolBudget | None = getattr(self, name)
            if pool is not None and pool.pooled:
                raise ValueError(f"pools.{name}.kv_state: one budget for KV and states is "
                                 f"implemented for the {', '.join(POOLED_TIERS)} tiers "
                                 "only; give this tier kv and state")
        return self
