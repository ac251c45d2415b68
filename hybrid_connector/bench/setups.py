"""The configurations the capacity benchmark compares, as real ``HybridConfig`` s.

=====================  ========================================  =======================
name                   tiers                                     policies
=====================  ========================================  =======================
none                   no cache (every prompt recomputed)        -
device-lru             device pool only                          LRU (engines' native)
device-ours            device pool only                          Marconi adm. + eviction
device+host-{lru,ours} device pool, host RAM                     LRU / ours
device+host+nvme-...   device pool, host RAM, NVMe directory     LRU / ours
vllm-block             device pool only                          vLLM align mode: one
                                                                 state per align block
                                                                 (528 tokens, Qwen3.5-4B),
                                                                 hits at block multiples,
                                                                 LRU
=====================  ========================================  =======================

"ours" is this project's default policy set: Marconi admission (checkpoints at branch
points and the last token) and Marconi eviction (recency + alpha x FLOPs saved per byte,
alpha tuned by replaying a bootstrap window). "lru" keeps the same admission and evicts by
recency alone (``eviction: lru``), which is what engines do natively. ``vllm-block`` is the
simulator's ``vllm_align`` baseline (``sim.baselines``) on real tiers.

Each tier's budget is split between KV and state pools in the proportion of the
configuration's own working set (what it stores with unlimited room; ``working_set``), so
no pool is sized for objects its configuration never makes. Anchors are off (exact hits
only). The device tier is GPU HBM when CUDA is present, else a CPU slab with the same
accounting (``hybrid_connector.tiers.device``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid_connector.bench.schema import CapacityConfig
from hybrid_connector.core.config import HybridConfig, load_config
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.runtime.session import RequestSession
from hybrid_connector.runtime.simulator import Simulator
from hybrid_connector.sim.baselines import vllm_align_block
from hybrid_connector.tiers.size_only import Budget, zero_payload

UNLIMITED = 1 << 50


@dataclass(frozen=True)
class Setup:
    """One configuration: its tiers and its policy overrides."""

    name: str
    tiers: tuple[str, ...]  # of "device", "host", "nvme"
    policy: dict[str, Any]

    @property
    def cached(self) -> bool:
        return bool(self.tiers)


def setup_of(name: str, cfg: CapacityConfig, geo: ModelGeometry) -> Setup:
    if name == "none":
        return Setup(name, (), {})
    if name == "vllm-block":
        block = vllm_align_block(geo)
        return Setup(name, ("device",), {"eviction": "lru", "admission": "every_block",
                                         "chunk_size": block, "alignment": block})
    tiers_part, pol = name.rsplit("-", 1)
    policy = ({"eviction": "lru"} if pol == "lru"
              else {"eviction": "marconi", "alpha": "auto", "alpha_grid": list(cfg.alpha_grid)})
    return Setup(name, tuple(tiers_part.split("+")), {"admission": "marconi", **policy})


def base_overrides(cfg: CapacityConfig, setup: Setup) -> dict[str, Any]:
    return {"chunk_size": cfg.chunk_size, "hash_block_size": cfg.hash_block_size,
            "alignment": cfg.alignment, "anchor_density": 0.25, "replay": False,
            "shadow_deterministic": True, **setup.policy}  # figures that repeat run to run


def split(total: int, mix: float) -> dict[str, int]:
    """``total`` bytes as KV and state pools, ``mix`` the KV share."""
    kv = int(total * mix)
    return {"kv": kv, "state": total - kv, "anchor": 0}


def hybrid_config(cfg: CapacityConfig, setup: Setup, budgets: dict[str, int], mix: float,
                  disk_path: str | None) -> HybridConfig:
    """The real config of ``setup`` with tier totals ``budgets`` (by tier name)."""
    over = base_overrides(cfg, setup)
    pools: dict[str, Any] = {"device": split(budgets["device"], mix)}
    over["device_size"] = budgets["device"]
    if "host" in setup.tiers:
        pools["host"] = split(budgets["host"], mix)
        over["max_local_cpu_size"] = f"{budgets['host']}B"
    else:
        over["local_cpu"] = False
    if "nvme" in setup.tiers:
        assert disk_path is not None
        pools["disk"] = split(budgets["nvme"], mix)
        over.update(local_disk=disk_path, max_local_disk_size=f"{budgets['nvme']}B",
                    disk_fsync=cfg.disk_fsync)
    over["pools"] = pools
    return load_config(None, over, environ={})


@dataclass(frozen=True)
class WorkingSet:
    """A configuration's footprint with unlimited room. The working set (``kv``,
    ``state``) is the peak, over the trace, of the bytes of objects that will still be hit:
    each object counts from the request that stores it to the last request that loads it
    (what a clairvoyant cache must hold to reach ``hit_rate``, the token hit rate no budget
    beats under these policies). ``stored`` is the peak of everything kept (objects never
    loaded again, dead states, included)."""

    kv: int
    state: int
    stored: int
    hit_rate: float

    @property
    def total(self) -> int:
        return self.kv + self.state

    @property
    def kv_share(self) -> float:
        return self.kv / self.total if self.total else 0.5


def working_set(cfg: CapacityConfig, setup: Setup, geo: ModelGeometry,
                records: list[dict[str, Any]]) -> WorkingSet:
    """``setup``'s footprint with unlimited room (the real ``HybridCache`` over a
    size-only store: no bytes, fast)."""
    over = {**base_overrides(cfg, setup), "eviction": "lru"}
    over.pop("alpha", None), over.pop("alpha_grid", None)
    config = load_config(None, over, environ={})
    budget = Budget.per_kind({ObjectKind.KV: UNLIMITED, ObjectKind.STATE: UNLIMITED})
    born: dict[Any, int] = {}
    last: dict[Any, int] = {}
    size: dict[Any, int] = {}
    hit = prompt = 0
    kvb, sb = geo.kv_bytes_per_token(), geo.state_bytes()
    with Simulator(config, geo, budget) as sim:
        cache = sim.cache
        tier = sim.store.tiers[0]
        put = tier.put

        def put_seen(items: Any, metas: Any = None) -> list[bool]:
            for key, t in items:
                born.setdefault(key, i)
                size[key] = t.numel()
            return put(items, metas)

        tier.put = put_seen  # type: ignore[method-assign]
        for i, r in enumerate(records):  # the runner's request procedure, size-only payloads
            inp, out = np.asarray(r["input_tokens"]), np.asarray(r["output_tokens"])
            s = RequestSession(cache, inp)
            s.load()
            s.release()
            for o in s.plan.objects if s.hit else ():
                last[o.ref.key] = i
            hit += s.hit
            prompt += int(inp.size)
            s.save_prefill(lambda a, b: zero_payload((b - a) * kvb),
                           {q: zero_payload(sb) for q in s.checkpoints})
            s.extend(out)
            end = cache.final_checkpoint(len(s.tokens))
            s.finish(lambda a, b: zero_payload((b - a) * kvb), {end: zero_payload(sb)} if end else {})
        stored = sim.store.peak[ObjectKind.KV] + sim.store.peak[ObjectKind.STATE]
    n = len(records) + 1
    live = {k: np.zeros(n, dtype=np.int64) for k in (ObjectKind.KV, ObjectKind.STATE)}
    for key, j in last.items():
        a = live[key.kind]
        a[born.get(key, 0)] += size[key]
        a[j + 1] -= size[key]
    kv_live, st_live = np.cumsum(live[ObjectKind.KV]), np.cumsum(live[ObjectKind.STATE])
    peak = int(np.argmax(kv_live + st_live))
    return WorkingSet(int(kv_live[peak]), int(st_live[peak]), stored,
                      hit / prompt if prompt else 0.0)
