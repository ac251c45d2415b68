"""Sparse placement benchmark: DP speed at N=131072 tokens, DP vs balanced, end to end.

Run: ``.venv/bin/python benchmarks/placement.py [--quick]``

1. Speed: the exact O(N M) hull DP on N = 131072 tokens in 64-token bins (2048 bins, every
   bin observed) with M = 64 slots, min of several runs, for the native build and the
   pure-Python loop, against the 50 ms target.
2. Quality: expected recomputation (tokens) of DP vs balanced spacing under a skewed
   overlap-depth distribution (an exponentially weighted histogram, decay 0.99, of 5000
   depths: 70% short follow-ups around 2K tokens, 30% deep ones near the end), and on a
   uniform one (where balanced is optimal and the two must tie).
3. End to end: shared-document QA through the real cache, Marconi with 0/2/4/8 placement
   slots per shared prefix (token hit rate, FLOPs saved, states saved).
Writes ``benchmarks/results/placement[_quick].md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hybrid_connector.geometry.presets import get_preset  # noqa: E402
from hybrid_connector.policies.admission import _hull_native  # noqa: E402
from hybrid_connector.policies.admission.placement import balanced, expected_recompute, solve_dp  # noqa: E402
from hybrid_connector.policies.admission.placement_hook import DepthHistogram  # noqa: E402
from hybrid_connector.policies.eviction.accounting import CorrectedAccounting  # noqa: E402
from hybrid_connector.sim.baselines import PolicySpec, _auto, _placement_adm  # noqa: E402
from hybrid_connector.sim.simulate import run_spec  # noqa: E402
from hybrid_connector.sim.traces import shared_document_qa  # noqa: E402

N_TOKENS, BIN, M = 131072, 64, 64


def timed(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def skewed_histogram(rng: np.random.Generator, n_bins: int) -> np.ndarray:
    h = DepthHistogram(BIN, decay=0.99)
    for _ in range(5000):
        if rng.random() < 0.7:
            d = rng.lognormal(np.log(2048), 0.5)
        else:
            d = N_TOKENS * (1 - rng.beta(1, 12))
        h.observe(int(min(d, N_TOKENS - 1)))
    w = h.weights[:n_bins].copy()
    w[w <= 0] = 1e-6  # every bin observed: the dense worst case for the DP
    return w


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    lines: list[str] = []

    def say(s: str) -> None:
        print(s)
        lines.append(s)

    n_bins = N_TOKENS // BIN
    rng = np.random.default_rng(0)
    w = skewed_histogram(rng, n_bins)
    say(f"## DP speed: N={N_TOKENS} tokens ({n_bins} bins of {BIN}), M={M}")
    native = _hull_native.load() is not None
    if native:
        t_nat = timed(lambda: solve_dp(w, M, backend="native"), 10)
        say(f"- native hull DP: {1e3 * t_nat:.2f} ms over M={M} slots")
    t_py = timed(lambda: solve_dp(w, M, backend="python"), 2 if args.quick else 3)
    say(f"- pure-Python hull DP: {1e3 * t_py:.1f} ms"
        + (f" ({t_py / t_nat:.0f}x the native build)" if native else " (no C compiler here)"))
    cost, pos = solve_dp(w, M)
    bal = expected_recompute(w, balanced(n_bins, M))
    mass = float(w.sum())
    say("\n## Expected recomputation (tokens per request)")
    say(f"- skewed: DP {BIN * cost / mass:.0f} vs balanced {BIN * bal / mass:.0f} "
        f"-> DP recomputes {bal / cost:.2f}x less")
    u = np.ones(n_bins)
    cu, _ = solve_dp(u, M)
    bu = expected_recompute(u, balanced(n_bins, M))
    say(f"- uniform: DP {BIN * cu / n_bins:.1f} vs balanced {BIN * bu / n_bins:.1f} (balanced is optimal: "
        f"{'tie' if abs(cu - bu) <= 1e-6 * bu + n_bins else 'DIFFERENT'})")

    say("\n## End to end: shared-document QA, Marconi (+ placement), real cache")
    geo = get_preset("marconi-7b")
    recs = shared_document_qa(4 if args.quick else 8, 120 if args.quick else 400, 0,
                              full_doc_prob=0.3, as_arrays=True)
    say("| slots | token hit rate | FLOPs saved | states saved |")
    say("|---|---|---|---|")
    base = None
    for slots in (0, 2, 4, 8):
        spec = PolicySpec(f"placement{slots}", "", {"eviction": "marconi", "alpha": 1.0,
                                                    "placement_slots": slots},
                          _auto(CorrectedAccounting, _placement_adm, False), _placement_adm)
        r = run_spec(recs, spec, geo, int(6e9))
        base = base or r
        say(f"| {slots} | {r.token_hit_rate:.3f} | {r.flops_saved_frac:.3f} | {r.states_saved} |")
    out = ROOT / "benchmarks" / "results" / ("placement_quick.md" if args.quick else "placement.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
