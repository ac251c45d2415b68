"""Sparse checkpoint placement (Sparse Prefix Caching, arXiv 2605.05219).

Given M checkpoint slots on a shared prefix and the distribution of future overlap depths
t (how far a request will match the prefix), place checkpoints C to minimise the expected
recomputation ``E[t - l(t; C)]``, ``l(t; C) = max({0} | {c in C : c <= t})`` (position 0, the
root, is free). All positions and depths here are in bins (callers bin tokens, e.g. 64).

``solve_dp`` is the exact O(N M) dynamic program with the monotone convex hull trick::

    f_0(e) = Q(e)
    f_m(e) = min_{0 <= s <= e} f_{m-1}(s) + w(s, e),   w(s, e) = Q(e) - Q(s) - s (P(e) - P(s))
           = Q(e) + min_s [ (-s) * P(e) + (f_{m-1}(s) - Q(s) + s P(s)) ]

with ``P(j) = sum_{t<j} p_t`` and ``Q(j) = sum_{t<j} t p_t`` over the first j support depths.
Each s is a line of slope -s (added in decreasing slope order) queried at P(e), which never
decreases, so a deque hull answers every query in amortised O(1). Lines s > e never win
(their value is at least f_{m-1}(e), which line s = e gives), so adding line e before query e
is exact. Only depths with positive weight matter and an optimal checkpoint always sits on
one (moving it up to the next observed depth never costs more), so the DP runs over the K
support depths: O(K M) <= O(N M). Integer weights give exact integer arithmetic.

``balanced`` is even spacing, optimal for uniform depths and in the worst case (Theorem 1),
and what ``place`` returns when there is no data.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from hybrid_connector.policies.admission import _hull_native


def expected_recompute(weights: Sequence[float] | np.ndarray, checkpoints: Iterable[int]) -> float:
    """``sum_t weights[t] * (t - l(t))`` for depths t = 0..len(weights)-1 (in bins)."""
    w = np.asarray(weights, dtype=np.float64)
    cps = sorted(c for c in set(int(c) for c in checkpoints) if c > 0)
    t = np.arange(w.size)
    last = np.zeros(w.size, dtype=np.int64)
    if cps:
        idx = np.searchsorted(np.asarray(cps), t, side="right") - 1
        last = np.where(idx >= 0, np.asarray(cps)[np.maximum(idx, 0)], 0)
    return float(np.sum(w * (t - last)))


def balanced(n: int, m: int) -> list[int]:
    """M evenly spaced positions in (0, n): ``round(k n / (m + 1))``, k = 1..m, deduplicated."""
    if n <= 1 or m <= 0:
        return []
    return sorted({int(round(k * n / (m + 1))) for k in range(1, m + 1)} - {0} - {n})


def solve_dp(
    weights: Sequence[float] | np.ndarray, m: int, backend: str = "auto"
) -> tuple[float, list[int]]:
    """Optimal placement of at most ``m`` checkpoints for depth weights ``weights[t]``.

    Returns (expected recomputation, sorted positions in bins). Positions are observed
    depths > 0; fewer than m come back when more would not help. ``backend``: ``"python"``
    (the reference loop; exact integer arithmetic for integer weights), ``"native"`` (the
    same loop compiled, float64; raises RuntimeError when unavailable) or ``"auto"``
    (native for float weights when it builds, else Python). Raises ValueError for negative
    weights or m < 0.
    """
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    w = np.asarray(weights)
    if w.ndim != 1:
        raise ValueError("weights must be 1-D")
    if w.size and float(w.min()) < 0:
        raise ValueError("weights must be >= 0")
    support = np.flatnonzero(w > 0)
    if support.size == 0:
        return 0.0, []
    integral = np.issubdtype(w.dtype, np.integer)
    if backend != "python" and not integral and m > 0:  # float64 copies: no Python lists
        native = _hull_native.hull_dp(support, w[support], m)
        if native is not None:
            return native[0], _backtrack(support.tolist(), native[1].tolist())
        if backend == "native":
            raise RuntimeError("native placement DP unavailable (no C compiler?)")
    depths = [int(d) for d in support]
    wts = [int(x) for x in w[support]] if integral else [float(x) for x in w[support]]
    cost, args = _dp_python(depths, wts, m)
    return float(cost), _backtrack(depths, args)


def _dp_python(depths: list[int], wts: list[Any], m: int) -> tuple[float, list[list[int]]]:
    """The hull DP over K support depths (see module docstring): ``f(e)`` covers the first
    e support depths; line s is a checkpoint at ``depths[s]``; line s = e stands for "slot
    unused" (its value at P(e) is ``f_{m-1}(e)``), line K has a slope below all others.
    Returns (f_M(K), per-layer argmin rows). Hot loop: preallocated hull, locals only."""
    k = len(depths)
    P = [0] * (k + 1)
    Q = [0] * (k + 1)
    for i in range(k):
        P[i + 1] = P[i] + wts[i]
        Q[i + 1] = Q[i] + depths[i] * wts[i]
    slopes = [-d for d in depths] + [-(depths[-1] + 1)]
    f_prev = list(Q)
    args: list[list[int]] = []
    rng = range(k + 1)
    for _ in range(m):
        f = [0] * (k + 1)
        arg = [0] * (k + 1)
        hk = [0] * (k + 1)
        hb = [0] * (k + 1)
        hi = [0] * (k + 1)
        top = -1
        head = 0
        for e in rng:
            sk = slopes[e]
            x = P[e]
            sb = f_prev[e] - Q[e] - sk * x
            while top > head:
                k1 = hk[top - 1]
                b1 = hb[top - 1]
                if (sb - b1) * (k1 - hk[top]) <= (hb[top] - b1) * (k1 - sk):
                    top -= 1
                else:
                    break
            top += 1
            hk[top] = sk
            hb[top] = sb
            hi[top] = e
            if head > top:
                head = top
            cur = hk[head] * x + hb[head]
            while head < top:
                nxt = hk[head + 1] * x + hb[head + 1]
                if nxt <= cur:
                    head += 1
                    cur = nxt
                else:
                    break
            f[e] = Q[e] + cur
            arg[e] = hi[head]
        args.append(arg)
        f_prev = f
    return f_prev[k], args


def _backtrack(depths: Sequence[int], args: Sequence[Sequence[int]] | np.ndarray) -> list[int]:
    pos: list[int] = []
    e = len(depths)
    for arg in reversed(args):
        s = int(arg[e])
        if s >= e:
            continue  # this slot is unused
        if depths[s] > 0:
            pos.append(int(depths[s]))
        e = s
    return sorted(set(pos))


def brute_force(weights: Sequence[float] | np.ndarray, m: int) -> tuple[float, list[int]]:
    """Exhaustive search over all placements of at most m positions in (0, len) (tests)."""
    from itertools import combinations

    n = len(weights)
    best: tuple[float, list[int]] = (expected_recompute(weights, []), [])
    for r in range(1, m + 1):
        for combo in combinations(range(1, n), r):
            c = expected_recompute(weights, combo)
            if c < best[0] - 1e-12:
                best = (c, list(combo))
    return best
