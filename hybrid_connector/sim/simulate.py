"""Run policy specs over a trace and collect metrics (``SimResult``).

Metrics (Marconi's, plus what this cache adds):

* token hit rate = sum of hit tokens / sum of prompt tokens; request hit rate = requests
  with a hit / requests; both split into exact and approximate (suffix replay) parts;
* FLOPs saved = sum over hits of ``geometry.flops_saved(hit)`` (per-family FLOPs; replay
  FLOPs of approximate hits are subtracted), also as a fraction of all prompt FLOPs;
* by kind: objects stored (a count: what the cache indexed), bytes stored (every byte the
  store accepted), bytes evicted and peak resident bytes;
* modeled TTFT (``prefill.PrefillModel``, a documented FLOPs + load model): mean, P50, P95.

``run_spec`` runs one spec; the ``oracle`` spec runs once per alpha in its grid and keeps
the best FLOPs saved (a fixed alpha chosen in hindsight). The cache size is either a total
(``int``: ``spec.budget`` pools KV and states in it, the reference's single cache size) or a
per-pool ``Budget`` used as given (``Budget.from_config``: a config's own pools). Everything
is deterministic.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.policies import build
from hybrid_connector.policies.base import EvictionPolicy
from hybrid_connector.policies.eviction.marconi import MarconiEviction
from hybrid_connector.runtime.simulator import Simulator
from hybrid_connector.sim.baselines import PolicySpec
from hybrid_connector.sim.prefill import PrefillModel
from hybrid_connector.sim.traces import Record
from hybrid_connector.tiers.size_only import Budget


@dataclass
class SimResult:
    """Outcome of one spec over one trace at one budget (plain data, JSON-safe)."""

    policy: str
    budget_bytes: int
    requests: int
    prompt_tokens: int
    hit_tokens: int
    approx_hit_tokens: int
    hits: int
    approx_hits: int
    flops_saved: float
    prompt_flops: float
    ttft_mean: float
    ttft_p50: float
    ttft_p95: float
    states_saved: int
    stored_objects: dict[str, int] = field(default_factory=dict)
    stored_bytes: dict[str, int] = field(default_factory=dict)
    evicted_bytes: dict[str, int] = field(default_factory=dict)
    peak_bytes: dict[str, int] = field(default_factory=dict)
    alpha: float | None = None
    alpha_history: list[tuple[int, float]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    @property
    def flops_saved_frac(self) -> float:
        return self.flops_saved / self.prompt_flops if self.prompt_flops else 0.0

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(token_hit_rate=self.token_hit_rate, request_hit_rate=self.request_hit_rate,
                 flops_saved_frac=self.flops_saved_frac)
        return d


def _arrays(r: Record) -> tuple[np.ndarray, np.ndarray]:
    return (np.asarray(r["input_tokens"], dtype=np.int64),
            np.asarray(r["output_tokens"], dtype=np.int64))


def _budget(spec: PolicySpec, size: int | Budget, state_share: float | None) -> Budget:
    if isinstance(size, Budget):
        if state_share is not None:
            raise ValueError("state_share splits a total size; a Budget is already split")
        return size
    return spec.budget(size, state_share)


def run_once(
    records: Sequence[Record], spec: PolicySpec, geometry: ModelGeometry, total_bytes: int | Budget,
    alpha: float | None = None, prefill: PrefillModel | None = None,
    base: dict[str, Any] | None = None, state_share: float | None = None,
) -> SimResult:
    """Replay ``records`` (sorted by ts here) through one fresh cache built from ``spec``;
    ``alpha`` forces a fixed alpha (the oracle's grid points)."""
    prefill = prefill or PrefillModel()
    over = dict(base or {})
    if alpha is not None:
        over["alpha"] = float(alpha)
    config = spec.config(over)
    budget = _budget(spec, total_bytes, state_share)
    eviction: EvictionPolicy
    if alpha is not None:
        eviction = MarconiEviction(alpha=float(alpha), **build.marconi_options(config))
    else:
        assert spec.eviction is not None, f"spec {spec.name} has no eviction factory"
        eviction = spec.eviction(config, geometry, budget)
    sim = Simulator(config, geometry, budget, eviction=eviction,
                    admission=spec.build_admission(config), anchors=spec.anchors)
    t0 = time.perf_counter()
    ordered = sorted(records, key=lambda r: (r["ts"], str(r["session_id"]), r["turn_id"]))
    hit_tok = approx_tok = hits = approx = prompt = 0
    saved = total_flops = 0.0
    ttfts = []
    with sim:  # closes the cache (and its policies); the statistics stay readable
        for r in ordered:
            inp, out = _arrays(r)
            res = sim.step(inp, out)
            prompt += res.prompt
            total_flops += geometry.flops_saved(res.prompt).total
            if res.hit:
                hits += 1
                hit_tok += res.hit
                gain = geometry.flops_saved(res.hit).total
                if not res.exact:
                    approx += 1
                    approx_tok += res.hit
                    gain -= prefill.replay_flops(geometry, res.replay_from or 0, res.hit)
                saved += gain
            ttfts.append(prefill.ttft(geometry, res.prompt, res.hit, res.loaded_bytes,
                                      res.replay_from))
    st = sim.cache.stats
    arr = np.asarray(ttfts) if ttfts else np.zeros(1)
    return SimResult(
        policy=spec.name, budget_bytes=budget.total, requests=len(ordered),
        prompt_tokens=prompt, hit_tokens=hit_tok, approx_hit_tokens=approx_tok, hits=hits,
        approx_hits=approx, flops_saved=saved, prompt_flops=total_flops,
        ttft_mean=float(arr.mean()), ttft_p50=float(np.percentile(arr, 50)),
        ttft_p95=float(np.percentile(arr, 95)), states_saved=sim.states_saved,
        stored_objects={k.value: st.stored[k.value] for k in ObjectKind},
        stored_bytes={k.value: sim.store.put_bytes[k] for k in ObjectKind},
        evicted_bytes=dict(st.evicted),
        peak_bytes={k.value: sim.store.peak[k] for k in ObjectKind},
        alpha=getattr(eviction, "alpha", None),
        alpha_history=list(getattr(eviction, "alpha_history", [])),
        wall_s=time.perf_counter() - t0,
    )


def run_spec(
    records: Sequence[Record], spec: PolicySpec, geometry: ModelGeometry, total_bytes: int | Budget,
    prefill: PrefillModel | None = None, base: dict[str, Any] | None = None,
    state_share: float | None = None,
) -> SimResult:
    """``run_once``, or for a spec with an ``alpha_grid`` (the oracle) the best grid point
    by FLOPs saved (ties: the smaller alpha)."""
    if not spec.alpha_grid:
        return run_once(records, spec, geometry, total_bytes, prefill=prefill, base=base,
                        state_share=state_share)
    best: SimResult | None = None
    t0 = time.perf_counter()
    for a in spec.alpha_grid:
        res = run_once(records, spec, geometry, total_bytes, alpha=a, prefill=prefill, base=base,
                       state_share=state_share)
        if best is None or res.flops_saved > best.flops_saved:
            best = res
    assert best is not None
    best.wall_s = time.perf_counter() - t0
    return best
