"""``benchmarks/policy_gaps.py``'s fixed-alpha variants run at their alpha, not the tuner."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_loader import load_script

from hybrid_connector.sim.traces import GENERATORS

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def pg():
    return load_script(BENCH / "policy_gaps.py")


@pytest.mark.parametrize(("variant", "alpha"), [("xalpha=8", 8.0), ("alpha=2", 2.0),
                                                ("placement", 2.0), ("placement_tree", 2.0)])
def test_fixed_variants_keep_their_alpha(pg, variant, alpha) -> None:
    recs = GENERATORS["blog_agentic"](3, 4, 0, as_arrays=True)  # type: ignore[operator]
    budget = 2**30
    row = pg.run_variant(recs, variant, budget)
    assert sum(row["stored_bytes"].values()) > budget, "the budget must force evictions"
    assert row["alpha"] == alpha and not row["alpha_history"], (row["alpha"], row["alpha_history"])
    assert row["token_hit_rate"] > 0
