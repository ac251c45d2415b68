"""One configuration of the capacity benchmark at one device budget, on real tiers.

``run_point`` replays a workload through a real ``HybridCache`` (``assemble.cache``) over
the tiers the configuration names (``assemble.store``: device slab, host slab, NVMe
files), request by request as an engine drives it (``RequestSession``): lookup, load,
verify, compute (modeled or real), save what admission asks, finish. Its accounting is
checked as it goes (``AccountingError``): hits + misses = requests, tokens loaded +
recomputed = prompt tokens (and both agree with the cache's own counters), every tier's
bytes of every kind within its budget after every request, every loaded object verified
(its bytes are the ones its tokens give and the ones saved under its key).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hybrid_connector import assemble
from hybrid_connector.bench.compute import ModeledCompute
from hybrid_connector.bench.objects import CorruptLoad, Payloads, Verifier
from hybrid_connector.bench.schema import CapacityConfig
from hybrid_connector.bench.setups import Setup, hybrid_config, split
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.plan import LoadPlan, LoadResult
from hybrid_connector.runtime.cache import HybridCache
from hybrid_connector.runtime.session import RequestSession

TIER_NAMES = {"device": "device", "host": "host", "nvme": "nvme", "disk": "nvme"}


class AccountingError(AssertionError):
    """The benchmark's accounting does not add up (a bug, never a result)."""


@dataclass
class PointResult:
    """One configuration at one ratio (plain data, JSON-safe)."""

    workload: str
    config: str
    ratio: float
    compute: str
    requests: int = 0
    hits: int = 0
    misses: int = 0
    prompt_tokens: int = 0
    tokens_loaded: int = 0
    tokens_recomputed: int = 0
    ttft_mean_s: float = 0.0
    ttft_p95_s: float = 0.0
    busy_s: float = 0.0  # sum of TTFTs: the prefill time of serving the trace
    overhead_s: float = 0.0  # busy_s split: fixed cost, recompute, loads (real: lookup+load+restore)
    compute_s: float = 0.0
    load_s: float = 0.0
    throughput_rps: float = 0.0
    budgets: dict[str, dict[str, int]] = field(default_factory=dict)  # tier -> kind -> bytes
    peak_bytes: dict[str, dict[str, int]] = field(default_factory=dict)
    loaded_bytes: dict[str, dict[str, int]] = field(default_factory=dict)
    loaded_objects: dict[str, int] = field(default_factory=dict)  # by tier
    hits_by_tier: dict[str, int] = field(default_factory=dict)  # by slowest tier a hit used
    objects_verified: int = 0
    reads_verified: int = 0
    movement: dict[str, Any] = field(default_factory=dict)
    cache_stats: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    ttfts: list[float] = field(default_factory=list, repr=False)

    @property
    def token_hit_rate(self) -> float:
        return self.tokens_loaded / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("ttfts")
        d.update(token_hit_rate=self.token_hit_rate, request_hit_rate=self.request_hit_rate)
        return d


ORDER = ("device", "host", "nvme")


def _nested(d: dict[str, Counter[str]]) -> dict[str, dict[str, int]]:
    return {t: dict(c) for t, c in d.items()}


class _Point:
    """Mutable accounting of one run (``PointResult`` when done)."""

    def __init__(self, res: PointResult, budgets: dict[str, dict[str, int]]) -> None:
        self.res = res
        self.res.budgets = budgets
        self.peak: dict[str, Counter[str]] = defaultdict(Counter)
        self.loaded: dict[str, Counter[str]] = defaultdict(Counter)
        self.objects: Counter[str] = Counter()
        self.by_tier: Counter[str] = Counter()

    def request(self, n: int, hit: int, plan: LoadPlan | None,
                parts: tuple[float, float, float]) -> None:
        """One request: ``parts`` its (overhead, recompute, load) seconds."""
        r = self.res
        ttft = sum(parts)
        r.overhead_s += parts[0]
        r.compute_s += parts[1]
        r.load_s += parts[2]
        r.requests += 1
        r.prompt_tokens += n
        r.tokens_loaded += hit
        r.tokens_recomputed += n - hit
        if hit:
            r.hits += 1
            assert plan is not None
            slowest = 0
            for o in plan.objects:
                t = TIER_NAMES[o.tier]
                self.loaded[t][o.ref.key.kind.value] += o.ref.nbytes
                self.objects[t] += 1
                slowest = max(slowest, ORDER.index(t))
            self.by_tier[ORDER[slowest]] += 1
        else:
            r.misses += 1
        r.ttfts.append(ttft)

    def tiers(self, cache: HybridCache | None) -> None:
        """Every tier's bytes per kind within its budget (and the peak)."""
        if cache is None:
            return
        for tier in cache.executor.tiers.values():
            name = TIER_NAMES[tier.name]
            for kind in ObjectKind:
                used, cap = tier.used(kind), self.res.budgets[name][kind.value]
                if used > cap:
                    raise AccountingError(f"{self.res.config}: tier {name} holds {used} B of "
                                          f"{kind.value}, above its budget {cap} B")
                self.peak[name][kind.value] = max(self.peak[name][kind.value], used)

    def done(self, cache: HybridCache | None, verifier: Verifier | None, wall: float) -> PointResult:
        r = self.res
        arr = np.asarray(r.ttfts or [0.0])
        r.ttft_mean_s, r.ttft_p95_s = float(arr.mean()), float(np.percentile(arr, 95))
        r.busy_s = float(arr.sum())
        r.throughput_rps = r.requests / r.busy_s if r.busy_s else 0.0
        r.peak_bytes, r.loaded_bytes = _nested(self.peak), _nested(self.loaded)
        r.loaded_objects, r.hits_by_tier = dict(self.objects), dict(self.by_tier)
        r.wall_s = wall
        if cache is not None and verifier is not None:
            st = cache.stats
            r.cache_stats = {"lookups": st.lookups, "hits": st.hits, "hit_tokens": st.hit_tokens,
                             "prompt_tokens": st.prompt_tokens, "stored": dict(st.stored),
                             "rejected": dict(st.rejected), "evicted_bytes": dict(st.evicted),
                             "load_failures": st.load_failures}
            r.reads_verified = verifier.verified
            ms = getattr(cache.store, "stats", None)
            if callable(ms):
                r.movement = {k: (dict(v) if isinstance(v, dict | Counter) else v)
                              for k, v in ms().items()}
        check(r)
        return r


def check(r: PointResult) -> None:
    """The accounting identities of one point (``AccountingError`` naming the broken one)."""
    problems = []
    if r.hits + r.misses != r.requests:
        problems.append(f"hits {r.hits} + misses {r.misses} != requests {r.requests}")
    if r.tokens_loaded + r.tokens_recomputed != r.prompt_tokens:
        problems.append(f"tokens loaded {r.tokens_loaded} + recomputed {r.tokens_recomputed} "
                        f"!= prompt tokens {r.prompt_tokens}")
    loaded = sum(r.loaded_objects.values())
    if r.objects_verified != loaded:
        problems.append(f"{loaded} objects loaded but {r.objects_verified} verified")
    if r.cache_stats:
        cs = r.cache_stats
        if (cs["lookups"], cs["hits"], cs["hit_tokens"], cs["prompt_tokens"]) != (
                r.requests, r.hits, r.tokens_loaded, r.prompt_tokens):
            problems.append(f"the cache counted {cs} but the benchmark {r.requests} requests, "
                            f"{r.hits} hits, {r.tokens_loaded}/{r.prompt_tokens} tokens")
        if r.reads_verified < loaded:
            problems.append(f"{loaded} objects loaded but only {r.reads_verified} reads checked")
    for tier, kinds in r.peak_bytes.items():
        for kind, n in kinds.items():
            if n > r.budgets[tier][kind]:
                problems.append(f"tier {tier} held {n} B of {kind} > budget {r.budgets[tier][kind]}")
    if problems:
        raise AccountingError(f"{r.workload}/{r.config} at {r.ratio}x: " + "; ".join(problems))


def _verify(pay: Payloads, plan: LoadPlan, loaded: LoadResult) -> int:
    """Check a hit's payloads against what their tokens give (a KV chunk reaching past
    the hit over ``[start, p)``); return how many objects were checked."""
    p = loaded.num_tokens
    reach = 0
    for obj, data in zip(plan.kv, loaded.kv, strict=True):
        ref = obj.ref
        if ref.start != reach:
            raise CorruptLoad(f"KV chunks of the hit are not contiguous at {reach}")
        upto = min(ref.end, p)
        per_token = ref.nbytes // (ref.end - ref.start)
        got = data.reshape(-1).view(torch.uint8).cpu()[: (upto - ref.start) * per_token]
        if upto > ref.start and not torch.equal(got, pay.kv(ref.start, upto, per_token)):
            raise CorruptLoad(f"KV chunk [{ref.start}, {ref.end}) has the wrong bytes")
        reach = ref.end
    if reach < p:
        raise CorruptLoad(f"a hit of {p} tokens with KV reaching only {reach}")
    n = len(plan.kv)
    if plan.state is not None:
        ref = plan.state.ref
        if ref.end != p or loaded.state is None or not torch.equal(
                loaded.state.reshape(-1).view(torch.uint8).cpu(), pay.state(p, ref.nbytes)):
            raise CorruptLoad(f"the state at {p} has the wrong bytes")
        n += 1
    elif p:
        raise CorruptLoad(f"an exact hit of {p} tokens without a state")
    return n


def open_cache(cfg: CapacityConfig, setup: Setup, geo: ModelGeometry,
               budgets: dict[str, int], mix: float, workdir: Path,
               model: Any = None) -> tuple[HybridCache, Verifier, Any]:
    """The real cache of ``setup`` (and the transformers runtime over it with ``model``)."""
    disk = None
    if "nvme" in setup.tiers:  # a fresh directory per run: nothing of another run is adopted
        disk = tempfile.mkdtemp(prefix=f"nvme-{setup.name}-", dir=workdir)
    hc = hybrid_config(cfg, setup, budgets, mix, disk)
    store = assemble.store(hc)
    verifier = Verifier(store.executor)
    if model is None:
        return assemble.cache(hc, geo, store), verifier, None
    from hybrid_connector.integrations.hf.runtime import HFRuntime

    rt = HFRuntime.create(model, hc, store, anchors=False, alignment=cfg.alignment)
    assert isinstance(rt.cache, HybridCache)  # embedded: the store is given
    return rt.cache, verifier, rt


def tier_budgets(setup: Setup, budgets: dict[str, int], mix: float) -> dict[str, dict[str, int]]:
    """Per tier, per kind budgets of ``setup`` (``budgets``: tier totals)."""
    return {t: split(budgets[t], mix) for t in setup.tiers}


def run_point(cfg: CapacityConfig, setup: Setup, geo: ModelGeometry, workload: str,
              records: list[dict[str, Any]], ratio: float, budgets: dict[str, int], mix: float,
              workdir: Path, model: Any = None, tick: Callable[[], None] = lambda: None
              ) -> PointResult:
    """Replay ``records`` through ``setup`` with tier totals ``budgets`` (see module doc).
    ``model``: a transformers model for ``compute: real`` (else modeled)."""
    res = PointResult(workload, setup.name, ratio, "real" if model is not None else "modeled")
    acc = _Point(res, tier_budgets(setup, budgets, mix))
    modeled = ModeledCompute(cfg, geo)
    t0 = time.perf_counter()
    if not setup.cached:
        for r in records:
            n = len(r["input_tokens"])
            acc.request(n, 0, None, (0.0, _none_ttft(model, r), 0.0) if model is not None
                        else modeled.parts(n, 0, None))
            tick()
        return acc.done(None, None, time.perf_counter() - t0)
    cache, verifier, rt = open_cache(cfg, setup, geo, budgets, mix, workdir, model)
    try:
        for r in records:
            if rt is not None:
                _real_request(rt, r, acc)
            else:
                _modeled_request(cache, modeled, r, acc)
            acc.tiers(cache)
            tick()
        cache.flush()
        acc.tiers(cache)
        cache.check_integrity()
        return acc.done(cache, verifier, time.perf_counter() - t0)
    finally:
        if rt is not None:
            rt.close()
        cache.close()
        if cache.config.disk_path:
            shutil.rmtree(cache.config.disk_path, ignore_errors=True)


def _modeled_request(cache: HybridCache, modeled: ModeledCompute, r: dict[str, Any],
                     acc: _Point) -> None:
    prompt = np.asarray(r["input_tokens"], dtype=np.int64)
    out = np.asarray(r["output_tokens"], dtype=np.int64)
    geo = cache.geometry
    kvb, sb = geo.kv_bytes_per_token(), geo.state_bytes()
    pay = Payloads(np.concatenate([prompt, out]))  # prompt tokens first: one chain for both
    s = RequestSession(cache, prompt)
    loaded = s.load()
    p = s.hit
    if p:
        acc.res.objects_verified += _verify(pay, s.plan, loaded)
    s.release()
    acc.request(int(prompt.size), p, s.plan if p else None, modeled.parts(int(prompt.size), p, s.plan))
    s.save_prefill(partial(pay.kv, per_token=kvb), {q: pay.state(q, sb) for q in s.checkpoints})
    s.extend(out)
    end = cache.final_checkpoint(len(s.tokens))
    s.finish(partial(pay.kv, per_token=kvb), {end: pay.state(end, sb)} if end else {})


def _none_ttft(model: Any, r: dict[str, Any]) -> float:
    """Measured full prefill of the prompt with the real model (no cache)."""
    from hybrid_connector.integrations.hf.state import model_forward, new_model_cache

    ids = torch.as_tensor(np.asarray(r["input_tokens"]), dtype=torch.long).unsqueeze(0)
    t = time.perf_counter()
    with torch.no_grad():
        model_forward(model, ids, new_model_cache(model),
                      torch.arange(ids.shape[1]).unsqueeze(0), logits_to_keep=1)
    return time.perf_counter() - t


def _real_request(rt: Any, r: dict[str, Any], acc: _Point) -> None:
    prompt = [int(x) for x in r["input_tokens"]]
    out = [int(x) for x in r["output_tokens"]]
    res = rt.prefill(prompt)
    info = res.info
    p = info.hit_tokens
    if info.computed_tokens != len(prompt) - p:
        raise AccountingError(f"the model computed {info.computed_tokens} tokens after a hit "
                              f"of {p} in a {len(prompt)}-token prompt")
    plan = res.session.plan
    if p:  # the Verifier checked their bytes against the saved digests on read
        acc.res.objects_verified += len(plan.objects)
    sec = info.seconds
    acc.request(len(prompt), p, plan if p else None,
                (0.0, sec.get("compute", 0.0), info.ttft - sec.get("compute", 0.0)))
    if out:
        rt.run_tokens(torch.tensor(out), res.model_cache, len(res.tokens), all_logits=False)
        res.tokens.extend(out)
        res.session.extend(out)
    rt.finish(res)
