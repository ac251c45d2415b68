"""Replayers for the alpha tuner: re-run a window of requests through a fresh cache.

``CacheReplayer(...)(window, alpha, eval_from)`` builds an empty ``HybridCache`` over a
``SizeOnlyStore`` with the live cache's budget, admission and accounting and a fixed-alpha
``MarconiEviction``, replays the window with the simulator's loop, and returns the
objective summed over ``window[eval_from:]``: FLOPs saved by hits (``"flops"``, measured with
the policy's own accounting, so ``marconi_reference`` tunes on the reference's FLOPs) or
hit tokens (``"token_hits"``). Pure: every call starts from nothing and closes its cache.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from hybrid_connector.config import HybridConfig
from hybrid_connector.keys import ObjectKind
from hybrid_connector.model import ModelGeometry
from hybrid_connector.policies.accounting import Accounting
from hybrid_connector.policies.base import AdmissionPolicy
from hybrid_connector.policies.marconi import MarconiEviction
from hybrid_connector.policies.tuner import TunerRequest
from hybrid_connector.sim.engine import Simulator
from hybrid_connector.sim.store import Budget

OBJECTIVES = ("flops", "token_hits")


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
            eviction=MarconiEviction(alpha=alpha, accounting=self.accounting),
            admission=self.admission(), anchors=self.anchors,
        ) as sim:
            for i, req in enumerate(window):
                res = sim.step(req.tokens[: req.prompt_len], req.tokens[req.prompt_len :])
                if i >= eval_from and res.hit:
                    total += res.hit if self.objective == "token_hits" else self._acct.hit_flops(res.hit)
        return total


def snapshot_budget(snapshot: Mapping[ObjectKind, int], headroom: float = 1.0) -> Budget:
    """Per-kind budgets from the bytes a live cache held at its first eviction (each pool
    was then about full); kinds holding nothing get the largest figure (not yet limited)."""
    top = max(snapshot.values(), default=0)
    return Budget.per_kind({k: int((v or top) * headroom) for k, v in snapshot.items()})


def default_replayer_factory(
    config: HybridConfig,
    admission: Callable[[], AdmissionPolicy],
    accounting: Callable[[ModelGeometry], Accounting],
    objective: str,
) -> Callable[[ModelGeometry, Mapping[ObjectKind, int]], CacheReplayer]:
    """What ``policies.build`` gives a live cache's Marconi policy: a replayer over the
    budget inferred at the first eviction (the policy is never told the store)."""

    def make(geometry: ModelGeometry, snapshot: Mapping[ObjectKind, int]) -> CacheReplayer:
        return CacheReplayer(config, geometry, snapshot_budget(snapshot), admission, accounting, objective)

    return make
