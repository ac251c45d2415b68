"""Sparse placement: DP exactness (vs brute force), balanced optimality, histogram, hook."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid_connector.policies.admission import _hull_native
from hybrid_connector.policies.admission.checkpoints import MarconiAdmission
from hybrid_connector.policies.admission.placement import (
    balanced,
    brute_force,
    expected_recompute,
    solve_dp,
)
from hybrid_connector.policies.admission.placement_hook import DepthHistogram, PlacementAdmission
from hybrid_connector.tree.radix import RadixTree


def test_expected_recompute_by_hand() -> None:
    w = [1, 0, 2, 1, 3]
    # No checkpoint: sum t * w_t = 0 + 0 + 4 + 3 + 12
    assert expected_recompute(w, []) == 19
    # Checkpoint at 2: depths 2,3,4 recompute 0,1,2 -> 0 + 1 + 6
    assert expected_recompute(w, [2]) == 7
    assert expected_recompute(w, [2, 4]) == 1


@pytest.mark.parametrize("backend", ["python", "auto"])
def test_dp_matches_brute_force_on_small_instances(backend: str) -> None:
    rng = np.random.default_rng(0)
    for _ in range(250):
        n, m = int(rng.integers(1, 11)), int(rng.integers(0, 4))
        for w in (rng.integers(0, 6, size=n), rng.random(n) * (rng.random(n) < 0.7)):
            cost, pos = solve_dp(w, m, backend=backend)
            best, _ = brute_force(w, m)
            assert cost == pytest.approx(best, abs=1e-9)
            assert expected_recompute(w, pos) == pytest.approx(cost, abs=1e-9)
            assert len(pos) <= m and all(0 < p < n for p in pos)


def test_native_and_python_agree_on_large_instances() -> None:
    if _hull_native.load() is None:
        pytest.skip("no C compiler: the native fast path is unavailable")
    rng = np.random.default_rng(1)
    w = rng.lognormal(0, 1.5, size=600)
    c_py, p_py = solve_dp(w, 12, backend="python")
    c_nat, p_nat = solve_dp(w, 12, backend="native")
    assert c_nat == pytest.approx(c_py, rel=1e-9)
    assert expected_recompute(w, p_nat) == pytest.approx(c_py, rel=1e-9)


@pytest.mark.parametrize(("segments", "m"), [(4, 3), (8, 7), (5, 1)])
def test_balanced_is_optimal_on_uniform(segments: int, m: int) -> None:
    n = segments * (m + 1)  # n divisible by m + 1: equal segments are exactly possible
    w = np.ones(n, dtype=np.int64)
    cost, pos = solve_dp(w, m)
    assert expected_recompute(w, balanced(n, m)) == cost
    assert pos == balanced(n, m)


def test_dp_beats_balanced_on_skewed_depths() -> None:
    w = np.zeros(256)
    w[10:20] = 5.0  # most requests stop early
    w[200] = 1.0
    cost, pos = solve_dp(w, 4)
    assert cost < expected_recompute(w, balanced(256, 4))
    assert any(10 <= p < 20 for p in pos)


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        solve_dp([1, -1], 1)
    with pytest.raises(ValueError, match="m must be"):
        solve_dp([1, 1], -1)
    assert solve_dp([0, 0, 0], 2) == (0.0, [])


def test_histogram_decays_and_replans() -> None:
    h = DepthHistogram(64, decay=0.5, replan_every=1)
    assert h.plan(10, 2) == balanced(10, 2)  # no data: balanced
    h.observe(64 * 3 + 5)
    assert h.weights[3] == 1.0
    h.observe(64 * 7)
    assert h.weights[3] == 0.5 and h.weights[7] == 1.0
    assert set(h.plan(10, 2)) == {3, 7}
    h.observe(64 * 40)  # beyond the prefix: clipped to its end
    assert 10 in h.plan(10, 3)
    with pytest.raises(ValueError):
        h.observe(-1)


def test_placement_admission_requests_dp_positions() -> None:
    tree = RadixTree()
    rng = np.random.default_rng(2)
    doc = rng.integers(3, 1000, size=2048)
    adm = PlacementAdmission(MarconiAdmission(), slots=2, bin_tokens=64, replan_every=1)
    prompt = np.concatenate([doc, [7, 8, 9]])
    first = adm.state_positions(tree, tree.match(prompt), prompt, 16)
    assert first == ()  # first sight, no cold start: nothing extra
    tree.insert(prompt)
    for depth in (640, 640, 1280):  # later requests share the doc to these depths
        q = np.concatenate([doc[:depth], rng.integers(1000, 2000, size=50)])
        pos = adm.state_positions(tree, tree.match(q), q, 16)
    assert 640 in pos and 1280 in pos
    assert all(p % 16 == 0 and 0 < p < q.size for p in pos)
    cold = PlacementAdmission(MarconiAdmission(), slots=3, cold_start=True)
    p2 = np.arange(3, 3 + 1024)
    assert cold.state_positions(tree, tree.match(p2), p2, 1) == tuple(64 * b for b in balanced(16, 3))


def test_anchor_pages_and_bytes(geo) -> None:
    from hybrid_connector.policies.admission.anchors import (
        anchor_block_bytes,
        anchor_keep,
        anchor_pages,
    )

    assert anchor_pages(0, 200, 64) == [(0, 64), (64, 128), (128, 192)]
    assert anchor_pages(65, 256, 64) == [(128, 192), (192, 256)]  # only fully computed pages
    assert anchor_pages(100, 120, 64) == []
    groups = len(geo.recurrent_groups())
    depth = max(len(g) for g in geo.recurrent_groups())
    conv = (geo.mamba2.conv_kernel - 1) * depth         # the convs of a group need these
    assert anchor_keep(geo, 64, 1 / 16) == max(4, conv) and anchor_keep(geo, 64, 0.75) == 48
    assert anchor_keep(geo, 4, 1.0) == 4                # never more than the page
    assert anchor_block_bytes(geo, 64, 1 / 16) == max(4, conv) * geo.hidden_size * 2 * groups
    with pytest.raises(ValueError):
        anchor_block_bytes(geo, 64, 0.0)
