"""The vLLM connector's telemetry through vLLM's own hooks: per-step worker counters
(``HybridStats``, summed over ranks and intervals, logged by vLLM as "KV Transfer
metrics"), Prometheus counters (``HybridPromMetrics``: vLLM registers them on its
``/metrics`` endpoint) and the tier each external hit came from (``hit_sources``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource
from vllm.v1.metrics.utils import create_metric_per_engine

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.index.plan import LoadPlan, PlannedObject


@dataclass
class Counters:
    """What the connector did (exported through vLLM's stats hooks)."""

    lookups: int = 0
    hits: int = 0
    hit_tokens: int = 0
    loads: int = 0
    loaded_tokens: int = 0
    failed_loads: int = 0
    hits_without_state: int = 0  # must stay 0 for a hybrid model (the hit rule)
    foreign_refused: int = 0  # hits refused: keyed by another request's hashes (namespace.py)
    restored: dict[str, int] = field(default_factory=dict)  # warm restart: indexed by kind
    saved_objects: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    hit_sources: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def loaded(self, objs: Sequence[PlannedObject], plan: LoadPlan, local: int, end: int,
               needs_state: bool) -> dict[CacheHitSource, int]:
        """Count a load of ``objs`` (``plan``'s objects vLLM lacks) for the external tokens
        ``[local, end)``; returns those tokens by source (``hit_sources``). ``needs_state``:
        a leased hit of a recurrent model, which must carry a state."""
        self.loads += 1
        self.loaded_tokens += end - local
        if needs_state and plan.state is None:
            self.hits_without_state += 1
        for o in objs:
            self.hit_sources[o.tier] += 1
        kv = [o for o in objs if o.ref.key.kind is ObjectKind.KV]
        return hit_sources([o.tier for o in kv], [(o.ref.key.start, o.ref.key.end) for o in kv],
                           local, end, plan.state.tier if plan.state is not None else None)

    def reported(self, ok: bool, tokens: int) -> None:
        """A load of a ``tokens``-token hit came back from every rank (``ok``: intact)."""
        if ok:
            self.hits += 1
            self.hit_tokens += tokens
        else:
            self.failed_loads += 1


#: counter -> what it counts (all totals since start, per engine).
COUNTERS = {
    "load_jobs": "hits loaded into vLLM's blocks (per rank)",
    "failed_loads": "loads that failed on a rank (the request was recomputed)",
    "loaded_bytes": "bytes read from the tiers into vLLM's blocks",
    "saved_objects": "KV chunks and state checkpoints copied out of vLLM's blocks",
    "saved_bytes": "bytes copied out of vLLM's blocks for saving",
}
TIERS = ("device", "host", "nvme", "remote")
SOURCE = {"device": CacheHitSource.HOST, "host": CacheHitSource.HOST,
          "nvme": CacheHitSource.DISK, "remote": CacheHitSource.EXTERNAL_UNSPECIFIED}


@dataclass
class HybridStats(KVConnectorStats):
    """Counters of one interval: ``COUNTERS`` keys plus ``loaded_from_<tier>`` (objects)."""

    data: dict[str, Any] = field(default_factory=dict)

    def add(self, key: str, n: int = 1) -> None:
        self.data[key] = self.data.get(key, 0) + n

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in other.data.items():
            self.add(k, int(v))
        return self

    def reduce(self) -> dict[str, int | float]:
        return {k: int(v) for k, v in sorted(self.data.items())}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class HybridPromMetrics(KVConnectorPromMetrics):
    """``vllm:hybrid_connector_<counter>_total`` per engine, and loaded objects by tier."""

    def __init__(self, vllm_config: Any, metric_types: dict[type, type], labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters: dict[str, dict[int, Any]] = {
            k: create_metric_per_engine(self._counter_cls(
                name=f"vllm:hybrid_connector_{k}", documentation=f"HybridConnector: {doc}",
                labelnames=labelnames), per_engine_labelvalues)
            for k, doc in COUNTERS.items()}
        by_tier = self._counter_cls(
            name="vllm:hybrid_connector_loaded_objects",
            documentation="HybridConnector: objects loaded, by the tier that held them",
            labelnames=[*labelnames, "tier"])
        self.by_tier: dict[tuple[int, str], Any] = {(idx, t): by_tier.labels(*vals, t)
                        for idx, vals in per_engine_labelvalues.items() for t in TIERS}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for k, v in transfer_stats_data.items():
            if k in self.counters and v:
                self.counters[k][engine_idx].inc(v)
            elif k.startswith("loaded_from_") and v:
                tier = k.removeprefix("loaded_from_")
                if (engine_idx, tier) in self.by_tier:
                    self.by_tier[(engine_idx, tier)].inc(v)


def hit_sources(tiers: Sequence[str | None], kv_spans: Sequence[tuple[int, int]],
                local: int, end: int, state_tier: str | None) -> dict[CacheHitSource, int]:
    """The external tokens ``[local, end)`` by the tier of the KV chunk that covers them;
    tokens no loaded chunk covers (vLLM held their KV, the state made them usable) count
    for the state's tier."""
    out: dict[CacheHitSource, int] = {}
    for tier, (s, e) in zip(tiers, kv_spans, strict=True):
        n = min(e, end) - max(s, local)
        if n > 0:
            src = SOURCE.get(tier or "", CacheHitSource.EXTERNAL_UNSPECIFIED)
            out[src] = out.get(src, 0) + n
    covered = sum(out.values())
    if covered < end - local:  # tokens only the state stands for (KV held by vLLM already)
        src = SOURCE.get(state_tier or "", CacheHitSource.EXTERNAL_UNSPECIFIED)
        out[src] = out.get(src, 0) + (end - local - covered)
    return out
