"""Build the configured policies (one place that maps config names to classes).

``eviction``: ``lru`` -> ``LRUEviction``; ``marconi`` -> ``MarconiEviction`` with the
corrected accounting (GQA-aware node-local bytes, per-family FLOPs); ``marconi_reference``
-> the same policy with the reference simulator's accounting and its FLOPs-saved tuning
objective. ``alpha: auto`` gets a tuner built at the first eviction: with ``alpha_tuner:
shadow`` (default) a ``ShadowTuner`` over twin caches from the injected ``shadows``, with
``window`` an ``AlphaTuner`` over the injected ``replayers`` (``hybrid_connector.assemble``
passes the size-only caches of ``hybrid_connector.runtime.tuner_caches``: the policies never
import the cache).

``admission``: ``marconi`` (wrapped in ``PlacementAdmission`` when ``placement_slots`` >
0), ``every_block`` (vLLM-style, one checkpoint per ``chunk_size``), ``last_token``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypedDict

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.policies.admission.checkpoints import (
    EveryBlockAdmission,
    LastTokenAdmission,
    MarconiAdmission,
)
from hybrid_connector.policies.admission.placement_hook import PlacementAdmission
from hybrid_connector.policies.base import AdmissionPolicy, EvictionPolicy
from hybrid_connector.policies.eviction.accounting import (
    Accounting,
    CorrectedAccounting,
    ReferenceAccounting,
)
from hybrid_connector.policies.eviction.lru import LRUEviction
from hybrid_connector.policies.eviction.marconi import MarconiEviction
from hybrid_connector.policies.tuning.base import LRU, Candidate, Tuner
from hybrid_connector.policies.tuning.grid import DEFAULT_GRID, AlphaTuner, Replayer
from hybrid_connector.policies.tuning.shadow import ShadowFactory, ShadowTuner, candidates

ACCOUNTING: dict[str, Callable[[ModelGeometry], Accounting]] = {
    "marconi": CorrectedAccounting,
    "marconi_reference": ReferenceAccounting,
}


def tuner_options(config: HybridConfig, background: bool = True) -> dict[str, object]:
    """``AlphaTuner`` keyword arguments from the config."""
    return {
        "grid": tuple(config.alpha_grid) if config.alpha_grid is not None else DEFAULT_GRID,
        "bootstrap_multiplier": config.bootstrap_multiplier,
        "retune_interval": config.retune_interval,
        "background": background,
    }


def objective(config: HybridConfig) -> str:
    """The tuning objective: the reference always tunes on FLOPs saved."""
    return "flops" if config.eviction == "marconi_reference" else config.alpha_objective


ReplayerSource = Callable[
    [HybridConfig, Callable[[], AdmissionPolicy], Callable[[ModelGeometry], Accounting], str],
    Callable[[ModelGeometry, Mapping[ObjectKind, int]], Replayer],
]


ShadowSource = Callable[
    [HybridConfig, Callable[[], AdmissionPolicy], Callable[[ModelGeometry], Accounting], str],
    Callable[[ModelGeometry, Mapping[ObjectKind, int]], ShadowFactory],
]


class MarconiOptions(TypedDict):
    joint_pool: bool
    score: str
    scan_resistant: bool
    fallback_first: bool


def marconi_options(config: HybridConfig) -> MarconiOptions:
    """The ``MarconiEviction`` keyword arguments every Marconi policy built from ``config``
    shares (a tuner's candidate may override ``score``). ``scan_resistant`` (stranded KV
    first, whole leaves in a shared budget, the scan guard: ``eviction.marconi_victims``)
    follows the ``scan_resistant`` config key, ``fallback_first`` ``fallback_states``."""
    return {"joint_pool": config.pooled_eviction == "utility", "score": config.marconi_score,
            "scan_resistant": config.scan_resistant, "fallback_first": config.fallback_states}


def shadow_options(config: HybridConfig, background: bool = True) -> dict[str, object]:
    """``ShadowTuner`` keyword arguments from the config. A user-given ``alpha_grid`` is
    the candidates' alphas and the tuner never extends past its top (``max_alpha``); the
    config has already refused a grid without the tuner's start."""
    scores = ("sum", "product") if config.shadow_score == "both" else (config.shadow_score,)
    grid = config.alpha_grid if config.alpha_grid is not None else config.shadow_alphas
    offered = tuple(dict.fromkeys(c for sc in scores for c in candidates(
        grid, config.shadow_lru, sc)))
    a0 = 0.0 if config.shadow_start == "lru" else float(config.shadow_start)
    start = LRU if a0 == 0 else Candidate(a0, False, scores[-1])
    if start not in offered:
        offered = (*offered, start)
    opts: dict[str, object] = {"offered": offered, "start": start, "z": config.shadow_z,
                               "z_early": config.shadow_z_early,
                               "early": config.shadow_early_requests, "background": background,
                               "deterministic": config.shadow_deterministic,
                               "cpu_share": config.shadow_cpu_share}
    if config.alpha_grid is not None:
        opts["max_alpha"] = max(config.alpha_grid)
    return opts


def eviction(config: HybridConfig, replayers: ReplayerSource | None = None,
             shadows: ShadowSource | None = None) -> EvictionPolicy:
    """The eviction policy named by ``config.eviction``. With ``alpha: auto``, the source
    ``config.alpha_tuner`` names (``shadows`` or ``replayers``, called with (config,
    admission, accounting, objective)) makes the tuner at the first eviction; without it
    the alpha stays at 0 (pure recency)."""
    if config.eviction == "lru":
        return LRUEviction()
    if config.eviction in ACCOUNTING:
        acct = ACCOUNTING[config.eviction]
        alpha = None if config.alpha == "auto" else float(config.alpha)
        args = (config, lambda: admission(config), acct, objective(config))
        make: Callable[[ModelGeometry, Mapping[ObjectKind, int]], Tuner] | None = None
        if alpha is None and config.alpha_tuner == "shadow" and shadows is not None:
            twins = shadows(*args)
            opts = shadow_options(config)

            def make(geo: ModelGeometry, snap: Mapping[ObjectKind, int]) -> Tuner:
                return ShadowTuner(twins(geo, snap), **opts)  # type: ignore[arg-type]
        elif alpha is None and config.alpha_tuner == "window" and replayers is not None:
            replay = replayers(*args)
            wopts = tuner_options(config)

            def make(geo: ModelGeometry, snap: Mapping[ObjectKind, int]) -> Tuner:
                return AlphaTuner(replay(geo, snap), **wopts)  # type: ignore[arg-type]
        return MarconiEviction(alpha=alpha, accounting=acct, tuner_factory=make,
                               **marconi_options(config))
    raise NotImplementedError(f"eviction policy {config.eviction!r} is not built yet")


def admission(config: HybridConfig) -> AdmissionPolicy:
    """The admission policy named by ``config.admission``."""
    if config.admission == "marconi":
        inner = MarconiAdmission()
        if config.placement_slots > 0:
            return PlacementAdmission(
                inner, config.placement_slots, config.placement_bin, config.placement_decay,
                tree=config.placement_tree,
            )
        return inner
    if config.admission == "every_block":
        return EveryBlockAdmission(config.chunk_size)
    return LastTokenAdmission()
