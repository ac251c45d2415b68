"""The policy sets the simulator compares, each a ``PolicySpec``.

=================  ==========================================================  =========
name               admission / eviction                                        hits at
=================  ==========================================================  =========
vllm_block         a state at every 32-token block, LRU (the paper's vLLM+)    32
vllm_align         one state per vLLM align block (``vllm_align_block``), LRU  block
sglang             Marconi admission, LRU refreshing the whole path (SGLang+)  1
lmcache            opaque align pages: KV chunk = state interval = block, LRU  block
marconi            Marconi admission, Marconi eviction, auto alpha (shadows)   1
marconi_window     as marconi, alpha from window replays (the v1 tuner)        1
marconi_reference  as marconi with the reference simulator's accounting        1
oracle             Marconi with the best fixed alpha in hindsight (grid)       1
placement          Marconi + sparse checkpoint placement, auto alpha           1
default            Marconi + sparse placement + anchors with suffix replay     1
=================  ==========================================================  =========

LRU here is ``MarconiEviction(alpha=0)`` (recency only) with the same incremental index;
the vLLM/SGLang/LMCache specs refresh the whole accessed path as those systems do. KV and
states share one byte budget (the reference's single cache size); a spec with anchors
gives ``anchor_share`` of the same total to a separate anchor pool. ``default``'s replay
hits are approximate (suffix replay) and reported as such.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybrid_connector.core.config import HybridConfig, load_config
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.policies import build
from hybrid_connector.policies.admission.checkpoints import EveryBlockAdmission, MarconiAdmission
from hybrid_connector.policies.admission.placement_hook import PlacementAdmission
from hybrid_connector.policies.base import AdmissionPolicy, EvictionPolicy
from hybrid_connector.policies.eviction.accounting import (
    Accounting,
    CorrectedAccounting,
    ReferenceAccounting,
)
from hybrid_connector.policies.eviction.marconi import MarconiEviction
from hybrid_connector.policies.tuning.base import Tuner
from hybrid_connector.policies.tuning.grid import DEFAULT_GRID, AlphaTuner
from hybrid_connector.policies.tuning.shadow import ShadowTuner
from hybrid_connector.runtime.tuner_caches import CacheReplayer, shadow_factory
from hybrid_connector.tiers.size_only import Budget

# What every spec shares unless it overrides: token-granular hits like the reference.
SIM_BASE: dict[str, Any] = {"chunk_size": 256, "hash_block_size": 256, "alignment": 1}


def vllm_align_block(geometry: ModelGeometry) -> int:
    """vLLM's mamba-aligned block: the tokens whose per-layer KV page is at least one
    layer's state, rounded up to 16 (528 for Qwen3.5-4B)."""
    n_attn = len(geometry.attention_layers)
    per_layer_tok = geometry.kv_bytes_per_token() / max(1, n_attn)
    per_layer_state = max(geometry.state_bytes_per_layer().values(), default=0)
    block = math.ceil(per_layer_state / per_layer_tok) if per_layer_tok else 16
    return max(16, -(-block // 16) * 16)


@dataclass
class PolicySpec:
    """One policy set: config overrides plus how to build admission and eviction.

    ``eviction(config, geometry, budget)``/``admission(config)`` build fresh policies for
    one run; ``alpha_grid`` (oracle only) lists the fixed alphas to try.
    """

    name: str
    description: str
    overrides: dict[str, Any] = field(default_factory=dict)
    eviction: Callable[[HybridConfig, ModelGeometry, Budget], EvictionPolicy] | None = None
    admission: Callable[[HybridConfig], AdmissionPolicy] | None = None
    anchors: bool = False
    anchor_share: float = 0.0
    alpha_grid: tuple[float, ...] = ()

    def config(self, base: dict[str, Any] | None = None) -> HybridConfig:
        return load_config(None, {**SIM_BASE, **(base or {}), **self.overrides}, environ={})

    def budget(self, total: int, state_share: float | None = None) -> Budget:
        """KV+states pooled (``state_share`` None, the reference's single size) or split
        with ``state_share`` of the non-anchor bytes for states (the deployed pools)."""
        anchor = int(total * self.anchor_share) if self.anchors else 0
        if state_share is None:
            return Budget.pooled(total - anchor, anchor)
        rest = total - anchor
        state = int(rest * state_share)
        return Budget.per_kind({ObjectKind.KV: rest - state, ObjectKind.STATE: state,
                                ObjectKind.ANCHOR: anchor})

    def build_admission(self, config: HybridConfig) -> AdmissionPolicy:
        return self.admission(config) if self.admission else build.admission(config)


def _lru(config: HybridConfig, geometry: ModelGeometry, budget: Budget) -> EvictionPolicy:
    return MarconiEviction(alpha=0.0, refresh_path=True)


def _auto(
    accounting: Callable[[ModelGeometry], Accounting], admission: Callable[[HybridConfig], AdmissionPolicy],
    anchors: bool,
) -> Callable[[HybridConfig, ModelGeometry, Budget], EvictionPolicy]:
    def make(config: HybridConfig, geometry: ModelGeometry, budget: Budget) -> EvictionPolicy:
        if config.alpha != "auto":
            return MarconiEviction(alpha=float(config.alpha), accounting=accounting,
                                   **build.marconi_options(config))
        objective = build.objective(config)
        replayer = CacheReplayer(
            config, geometry, budget, lambda: admission(config), accounting, objective, anchors
        )
        tuner: Tuner
        if config.alpha_tuner == "shadow":
            tuner = ShadowTuner(shadow_factory(replayer), **build.shadow_options(config, background=False))  # type: ignore[arg-type]
        else:
            tuner = AlphaTuner(replayer, **build.tuner_options(config, background=False))  # type: ignore[arg-type]
        return MarconiEviction(alpha=None, accounting=accounting, tuner=tuner,
                               **build.marconi_options(config))

    return make


def _marconi_adm(config: HybridConfig) -> AdmissionPolicy:
    return MarconiAdmission()


def _placement_adm(config: HybridConfig) -> AdmissionPolicy:
    return PlacementAdmission(
        MarconiAdmission(), config.placement_slots, config.placement_bin, config.placement_decay,
        tree=config.placement_tree,
    )


def baseline_specs(
    geometry: ModelGeometry, grid: tuple[float, ...] | None = None, placement_slots: int = 4,
    include_reference: bool = True,
) -> list[PolicySpec]:
    """Every spec of the module table for ``geometry``. A ``grid`` is the auto specs'
    ``alpha_grid`` (their tuners try only it) and the oracle's; without one the tuners
    keep their own grids and the oracle tries the window tuner's."""
    block = vllm_align_block(geometry)
    tuned: dict[str, Any] = {"alpha_grid": grid} if grid else {}
    grid = grid or DEFAULT_GRID
    align_pages = {"chunk_size": block, "hash_block_size": 16, "alignment": block}
    specs = [
        PolicySpec("vllm_block", "state every 32-token block, LRU",
                   {"alignment": 32, "chunk_size": 256, "hash_block_size": 32},
                   _lru, lambda c: EveryBlockAdmission(32)),
        PolicySpec("vllm_align", f"one state per {block}-token align block, LRU",
                   {"alignment": block, "chunk_size": 256, "hash_block_size": 16},
                   _lru, lambda c: EveryBlockAdmission(block)),
        PolicySpec("sglang", "Marconi admission, LRU (path refresh)", {}, _lru, _marconi_adm),
        PolicySpec("lmcache", f"opaque {block}-token align pages, LRU", align_pages,
                   _lru, lambda c: EveryBlockAdmission(block)),
        PolicySpec("marconi", "Marconi admission + eviction, auto alpha",
                   {"eviction": "marconi", "alpha": "auto", **tuned},
                   _auto(CorrectedAccounting, _marconi_adm, False), _marconi_adm),
        PolicySpec("marconi_window", "Marconi, auto alpha from window replays (v1 tuner)",
                   {"eviction": "marconi", "alpha": "auto", **tuned,
                    "alpha_tuner": "window"},
                   _auto(CorrectedAccounting, _marconi_adm, False), _marconi_adm),
    ]
    if include_reference:
        specs.append(PolicySpec(
            "marconi_reference", "Marconi with the reference simulator's accounting",
            {"eviction": "marconi_reference", "alpha": "auto", **tuned},
            _auto(ReferenceAccounting, _marconi_adm, False), _marconi_adm))
    specs += [
        PolicySpec("oracle", "Marconi, best fixed alpha in hindsight",
                   {"eviction": "marconi", "alpha_grid": grid}, None, _marconi_adm,
                   alpha_grid=grid),
        PolicySpec("placement", "Marconi + sparse placement, auto alpha (no anchors)",
                   {"eviction": "marconi", "alpha": "auto", **tuned,
                    "placement_slots": placement_slots},
                   _auto(CorrectedAccounting, _placement_adm, False), _placement_adm),
        PolicySpec("default", "Marconi + placement + anchors (replay, approximate)",
                   {"eviction": "marconi", "alpha": "auto", **tuned,
                    "placement_slots": placement_slots, "replay": True},
                   _auto(CorrectedAccounting, _placement_adm, True), _placement_adm,
                   anchors=True, anchor_share=0.1),
    ]
    return specs
