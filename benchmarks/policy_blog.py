"""Auto alpha on the Marconi blog post's two traces: against LRU and the best fixed alpha.

Run: ``.venv/bin/python benchmarks/policy_blog.py [--quick] [--jobs N] [--only V,...]``

The traces are ``sim.traces_blog`` (A: 15 long prefixes of 4K-12K tokens reused ~20 times
plus 40 hot short prefixes; B: the same hot prefixes, long entries seen once or twice) on
the post's model (4 attention + 24 SSM layers, D 4096, N 128: ``marconi-7b``) with its
6 GiB budget, KV and states in one pool, through the real ``HybridCache`` over size-only
tiers (``policy_gaps.run_variant``). Prints, per trace, token hit rate and FLOPs saved of
LRU (path refresh), every fixed alpha of the shadow tuner's default grid in both scores,
and auto (the shadow tuner, default config), the ratios auto / LRU and auto / best fixed,
and when auto switched (request: alpha). ``--quick`` halves both traces and the budget.
A complete run (no ``--only`` / ``--traces``) writes ``results/policy_blog[_quick].txt``.
Criteria (the sweep's): auto >= 0.9 x best fixed, and auto >= LRU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.append(str(Path(__file__).resolve().parent))

import policy_gaps as pg  # noqa: E402

from hybrid_connector.sim.traces_blog import blog_agentic, blog_chat  # noqa: E402

GIB = 2**30
TRACES = {  # name -> (generator, full kwargs, quick kwargs)
    "blog_agentic": (blog_agentic, {}, {"long_prefixes": 8}),
    "blog_chat": (blog_chat, {}, {"long_entries": 250}),
}
BUDGET = {"full": 6 * GIB, "quick": 3 * GIB}


def records(name: str, quick: bool) -> list[dict[str, Any]]:
    gen, full, small = TRACES[name]
    return gen(**(small if quick else full), as_arrays=True)  # type: ignore[operator]


def job(args: tuple[str, bool, str]) -> dict[str, Any]:
    name, quick, variant = args
    row = pg.run_variant(records(name, quick), variant, BUDGET["quick" if quick else "full"])
    row["trace"] = name
    return row


def table(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for name in TRACES:
        at = {r["variant"]: r for r in rows if r["trace"] == name}
        if not at:
            continue
        out.append(f"{name}: {next(iter(at.values()))['requests']} requests")
        for v, r in sorted(at.items()):
            out.append(f"  {v:14s} token hit {r['token_hit_rate']:.4f}  FLOPs saved "
                       f"{100 * r['flops_saved_frac']:5.1f}%  {r['wall_s']:6.1f}s")
        fixed = {v: r["token_hit_rate"] for v, r in at.items() if "alpha=" in v}
        if "marconi" in at and "lru" in at and fixed:
            best_v = max(fixed, key=lambda v: fixed[v])
            auto, lru, best = at["marconi"]["token_hit_rate"], at["lru"]["token_hit_rate"], fixed[best_v]
            hist = ", ".join(f"{n}: {a:g}" for n, a in at["marconi"].get("alpha_history") or [])
            out.append(f"  auto / LRU {auto / lru:.3f}   auto / best fixed ({best_v}) "
                       f"{auto / best:.3f}   switches at request [{hist}]")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="half-size traces and budget")
    ap.add_argument("--only", default="", help="only these variants (comma list)")
    ap.add_argument("--traces", default=",".join(TRACES), help="comma list of traces")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    variants = [v for v in pg.VARIANTS if v not in ("marconi_window", "marconi_joint")
                and (not args.only or v in args.only.split(","))]
    jobs = [(t, args.quick, v) for t in args.traces.split(",") for v in variants]
    jobs.sort(key=lambda j: j[2] != "marconi")  # the slowest first
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(job, jobs))
    text = "\n".join(table(rows)) + f"\n{len(jobs)} simulations in {time.perf_counter() - t0:.0f}s\n"
    print(text, end="")
    if not args.only and args.traces == ",".join(TRACES):  # a complete run: keep it
        out = Path(__file__).resolve().parent / "results" / f"policy_blog{'_quick' if args.quick else ''}.txt"
        out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
