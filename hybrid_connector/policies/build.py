"""Build the configured policies (one place that maps config names to classes)."""

from __future__ import annotations

from hybrid_connector.config import HybridConfig
from hybrid_connector.policies.admission import (
    EveryBlockAdmission,
    LastTokenAdmission,
    MarconiAdmission,
)
from hybrid_connector.policies.base import AdmissionPolicy, EvictionPolicy
from hybrid_connector.policies.lru import LRUEviction


def eviction(config: HybridConfig) -> EvictionPolicy:
    """The eviction policy named by ``config.eviction``."""
    if config.eviction == "lru":
        return LRUEviction()
    raise NotImplementedError(f"eviction policy {config.eviction!r} is not built yet")


def admission(config: HybridConfig) -> AdmissionPolicy:
    """The admission policy named by ``config.admission``."""
    if config.admission == "marconi":
        return MarconiAdmission()
    if config.admission == "every_block":
        return EveryBlockAdmission(config.chunk_size)
    return LastTokenAdmission()
