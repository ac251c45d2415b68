"""The caches the alpha tuners score candidates on (``policies.tuning``): size-only
``HybridCache``s driven by the ``Simulator``. ``hybrid_connector.assemble`` hands
``default_replayer_factory`` / ``default_shadow_factory`` to ``policies.build`` (the
policies never import the cache).

``CacheReplayer(...)(window, alpha, eval_from)`` builds an empty ``HybridCache`` over a
``SizeOnlyStore`` with the live cache's budget, admission and accounting and a fixed-alpha
``MarconiEviction``, runs the window through a ``Simulator``, and returns the
objective summed over ``window[eval_from:]``: FLOPs saved by hits (``"flops"``, measured with
the policy's own accounting, so ``marconi_reference`` tunes on the reference's FLOPs) or
hit tokens (``"token_hits"``). Pure: every call starts from nothing and closes its cache.

``CacheShadow`` is the shadow tuner's twin: the same kind of size-only cache, kept across
calls, stepped one request at a time with one candidate's alpha and refresh mode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.policies import build
from hybrid_connector.policies.base import AdmissionPolicy
from hybrid_connector.policies.eviction.accounting import Accounting
from hybrid_connector.policies.eviction.marconi import MarconiEviction
from hybrid_connector.policies.tuning.base import Candidate, TunerRequest
from hybrid_connector.policies.tuning.shadow import ShadowFactory
from hybrid_connector.runtime.simulator import Simulator, StepResult
from hybrid_connector.tiers.size_only import Budget

OBJECTIVES = ("flops", "token_hits")


def _serve(sim: Simulator, req: TunerRequest) -> StepResult:
    """``req`` through ``sim``, keyed by the prefix hashes the request computes once for
    every twin or replay serving it."""
    return sim.step(req.tokens[: req.prompt_len], req.tokens[req.prompt_len :],
                    req.hasher(sim.config.hash_block_size))


class CacheReplayer:
    """Replays tuner windows through the real cache (see module docstring)."""

    def __init__(
        self,
        config: HybridConfig,
        geometry: ModelGeometry,
        budget: Budget,
        admission: Callable[[], AdmissionPolicy],
        accounting: Callable[[ModelGeometry], Accounting],
        objective: str = "flops",
        anchors: bool = False,
    ) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        self.config = config
        self.geometry = geometry
        self.budget = budget
        self.admission = admission
        self.accounting = accounting
        self.objective = objective
        self.anchors = anchors
        self._acct = accounting(geometry)
        self.calls = 0

    def __call__(self, window: Sequence[TunerRequest], alpha: float, eval_from: int) -> float:
        self.calls += 1
        total = 0.0
        with Simulator(
            self.config, self.geometry, self.budget,
            eviction=MarconiEviction(alpha=alpha, accounting=self.accounting,
                                     **build.marconi_options(self.config)),
            admission=self.admission(), anchors=self.anchors,
        ) as sim:
            for i, req in enumerate(window):
                res = _serve(sim, req)
                if i >= eval_from:
                    total += self.score(res.hit)
        return total

    def score(self, hit: int) -> float:
        """The objective of one request that hit ``hit`` tokens."""
        if not hit:
            return 0.0
        return float(hit) if self.objective == "token_hits" else self._acct.hit_flops(hit)


class CacheShadow:
    """A persistent size-only twin cache for one ``Candidate`` (``ShadowTuner``'s shadow).

    ``step`` serves one request like the live cache (lookup, then saves) and returns its
    objective (see module docstring); nothing is shared with the live cache."""

    def __init__(self, replayer: CacheReplayer, candidate: Candidate) -> None:
        self._r = replayer
        self.candidate = candidate
        self.sim = Simulator(
            replayer.config, replayer.geometry, replayer.budget,
            eviction=MarconiEviction(
                alpha=candidate.alpha, accounting=replayer.accounting,
                refresh_path=candidate.refresh_path, score=candidate.score,
                joint_pool=build.marconi_options(replayer.config)["joint_pool"]),
            admission=replayer.admission(), anchors=replayer.anchors,
        )
        self._closed = False

    def step(self, request: TunerRequest) -> float:
        return self._r.score(_serve(self.sim, request).hit)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.sim.close()


def shadow_factory(replayer: CacheReplayer) -> ShadowFactory:
    """Twins with ``replayer``'s config, budget, admission, accounting and objective."""
    return lambda candidate: CacheShadow(replayer, candidate)


def snapshot_budget(snapshot: Mapping[ObjectKind, int], headroom: float = 1.0,
                    joint: bool = False) -> Budget:
    """Per-kind budgets from the bytes a live cache held at its first eviction (each pool
    was then about full); kinds holding nothing get the largest figure (not yet limited).
    ``joint``: the live cache's KV and states share one budget, so the twins' do too (their
    sum then)."""
    top = max(snapshot.values(), default=0)
    sizes = {k: int((v or top) * headroom) for k, v in snapshot.items()}
    if joint:
        both = int((snapshot.get(ObjectKind.KV, 0) + snapshot.get(ObjectKind.STATE, 0)) * headroom)
        return Budget.pooled(both or sizes.get(ObjectKind.KV, 0), sizes.get(ObjectKind.ANCHOR, 0))
    return Budget.per_kind(sizes)


def default_replayer_factory(
    config: HybridConfig,
    admission: Callable[[], AdmissionPolicy],
    accounting: Callable[[ModelGeometry], Accounting],
    objective: str,
) -> Callable[[ModelGeometry, Mapping[ObjectKind, int]], CacheReplayer]:
    """What ``policies.build`` gives a live cache's Marconi policy: a replayer over the
    budget inferred at the first eviction (the policy is never told the store)."""

    def make(geometry: ModelGeometry, snapshot: Mapping[ObjectKind, int]) -> CacheReplayer:
        budget = snapshot_budget(snapshot, joint=Budget.joint(config))
        return CacheReplayer(config, geometry, budget, admission, accounting, objective)

    return make


def default_shadow_factory(
    config: HybridConfig,
    admission: Callable[[], AdmissionPolicy],
    accounting: Callable[[ModelGeometry], Accounting],
    objective: str,
) -> Callable[[ModelGeometry, Mapping[ObjectKind, int]], ShadowFactory]:
    """What ``policies.build`` gives a live cache's shadow tuner: twins over the budget
    inferred at the first eviction."""
    replayers = default_replayer_factory(config, admission, accounting, objective)
    return lambda geometry, snapshot: shadow_factory(replayers(geometry, snapshot))
