"""On small versions of the Marconi blog post's two traces the shadow tuner ends in the
right family: a sum-score alpha on the agentic one (long prefixes reused between hot short
ones: FLOPs per byte pays), never the sum score on the chat one (long entries that die:
the sum score keeps them and loses to LRU), and not below LRU on either."""

from __future__ import annotations

import dataclasses

import pytest

from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.policies.eviction.marconi import MarconiEviction
from hybrid_connector.sim.baselines import baseline_specs
from hybrid_connector.sim.simulate import run_once
from hybrid_connector.sim.traces_blog import blog_agentic, blog_chat

GEO = get_preset("marconi-7b")
SPECS = {s.name: s for s in baseline_specs(GEO, include_reference=False)}
BASE = {"alpha_objective": "token_hits"}


def _auto(recs, size: int):
    made: list[MarconiEviction] = []
    make = SPECS["marconi"].eviction
    assert make is not None

    def keep(config, geometry, budget):
        made.append(make(config, geometry, budget))  # type: ignore[arg-type]
        return made[-1]

    res = run_once(recs, dataclasses.replace(SPECS["marconi"], eviction=keep), GEO, size, base=BASE)
    return res, made[0]


@pytest.mark.parametrize("kind", ["agentic", "chat"])
def test_the_tuner_ends_in_the_family_the_blog_trace_needs(kind) -> None:
    if kind == "agentic":
        recs, size = blog_agentic(6, 12, 0, as_arrays=True), 2 * 2**30
    else:
        recs, size = blog_chat(80, 40, 0, as_arrays=True), 3 * 2**30
    auto, pol = _auto(recs, size)
    lru = run_once(recs, SPECS["sglang"], GEO, size, base=BASE)
    fixed_sum = run_once(recs, SPECS["marconi"], GEO, size, alpha=2.0, base=BASE)
    if kind == "agentic":
        assert fixed_sum.token_hit_rate > lru.token_hit_rate + 0.05  # the trace is as described
        assert pol.alpha > 0 and pol.score == "sum", pol.alpha_history
        assert auto.token_hit_rate >= 0.9 * fixed_sum.token_hit_rate
    else:
        assert fixed_sum.token_hit_rate < lru.token_hit_rate - 0.05
        assert pol.alpha == 0 or pol.score == "product", (pol.alpha, pol.score)
        assert auto.token_hit_rate >= lru.token_hit_rate
