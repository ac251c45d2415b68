"""The load gate at vLLM's hit query (``SchedulerSide.match``): when the deepest hit needs
objects from a slow tier (``LoadPlan.is_async``), take instead the shallower hit or vLLM's
own local hit whose loads and recompute together are modeled fastest
(``policies.admission.load_gate``). Off unless ``load_gate.enabled``; a hit all on fast
tiers is never gated.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.index.cache_index import CacheIndex
from hybrid_connector.index.candidates import shallower_plans
from hybrid_connector.index.plan import MISS, LoadPlan
from hybrid_connector.policies.admission.load_gate import LoadCost, Option, cheapest


def option_of(plan: LoadPlan, local: int) -> Option:
    """The plan as a gate option: the bytes of what vLLM lacks with ``local`` tokens of its
    own (KV chunks wholly below them are not read, as ``SchedulerSide.allocated`` does)."""
    by_tier: dict[str, int] = defaultdict(int)
    for o in plan.objects:
        if o.ref.key.kind is not ObjectKind.KV or o.ref.key.end > local:
            by_tier[o.tier] += o.ref.nbytes
    return Option(plan.num_tokens, dict(by_tier))


def gated(index: CacheIndex, config: HybridConfig, tokens: Sequence[int] | np.ndarray,
          plan: LoadPlan, local: int, alignment: int) -> LoadPlan:
    """``plan`` or the cheaper hit to take instead (``MISS``: vLLM's local hit of ``local``
    tokens, load nothing). ``plan`` unchanged when the gate is off, the plan is no exact
    hit past ``local`` or all its objects are on fast tiers."""
    if (not config.load_gate.enabled or not plan.is_async or not plan.exact
            or plan.num_tokens <= local):
        return plan
    plans = [plan, *shallower_plans(index, tokens, plan, local, alignment)]
    options = [*(option_of(p, local) for p in plans), Option(local)]
    cost = LoadCost(config.load_gate, index.geometry)
    pick = cheapest(options, len(tokens), cost)
    return plans[pick] if pick < len(plans) else MISS
