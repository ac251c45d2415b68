"""Policy benchmark: every baseline over every generated trace at several cache sizes.

Run: ``.venv/bin/python benchmarks/policies.py [--suite gaps|baselines|all] [--quick] [--jobs N]``

``--suite gaps`` (default; ``policy_gaps.py``): the policies v2 sweep: auto alpha (shadow
tuner, and the v1 window tuner) against LRU and the best fixed alpha on every trace family
incl. the one-shot chat family, three sizes each, MET / NOT MET per row, and the agentic
ratio against vLLM-style per-block checkpointing; writes ``policy_gaps[_quick].{json,md,png}``.
``--suite baselines``: the table below.

For each trace (agentic with side calls, ShareGPT-like chat, shared-document QA, system
prompts; deterministic seeds) and each cache size (fractions of the trace's footprint: the
KV bytes of every distinct token prefix), it replays the trace through the real
``HybridCache`` for each policy set of ``hybrid_connector.sim.baselines`` and reports token
hit rate, request hit rate, FLOPs saved and modeled TTFT. Writes
``benchmarks/results/policies[_quick].{csv,md,png}`` and prints the table, the ordering
check on the agentic trace, and the eviction micro-benchmark (incremental index vs the
full-walk reference on the same tree: same victims, time per eviction, ratio).

KV and states share one byte budget (the reference's single cache size); ``default``
gives 10% of it to anchors. Auto alpha uses the grid below with the reference's bootstrap
multiplier 5, a 100-request floor on the window, and re-tuning every 100 requests (the
reference's 500 never comes on traces this short); ``oracle`` is the best fixed alpha of
the same grid in hindsight. Sizes are fractions of each trace's footprint; the agentic
footprint counts every dead branch and side call, so its fractions are smaller.
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))  # after the packages: benchmarks/tiers.py is a script

from hybrid_connector.core.keys import ObjectKind  # noqa: E402
from hybrid_connector.geometry.presets import get_preset  # noqa: E402
from hybrid_connector.sim import traces  # noqa: E402
from hybrid_connector.sim.baselines import baseline_specs  # noqa: E402
from hybrid_connector.sim.simulate import run_spec  # noqa: E402
from hybrid_connector.tree.radix import RadixTree  # noqa: E402

MODEL = "marconi-7b"
BASE = {"bootstrap_multiplier": 5, "retune_interval": 100}
FULL = {
    "grid": (0.0, 0.25, 0.5, 1.0, 2.0),
    "fractions": {"agentic": (0.03, 0.06, 0.12), "*": (0.1, 0.25, 0.5)},
    "traces": {
        "agentic": ("agentic", (12, 24, 0), {"sessions_per_second": 1.0, "side_calls": 2.0}),
        "chat": ("chat", (40, 10, 0), {"lengths": "sharegpt", "num_system_prompts": 4, "session_gap": 2.0}),
        "docqa": ("docqa", (8, 200, 0), {}),
        "sysprompt": ("sysprompt", (4, 300, 0), {}),
    },
}
QUICK = {
    "grid": (0.0, 0.5, 2.0),
    "fractions": {"agentic": (0.045, 0.09), "*": (0.15, 0.4)},
    "traces": {
        "agentic": ("agentic", (8, 16, 0), {"sessions_per_second": 1.0, "side_calls": 2.0}),
        "chat": ("chat", (16, 8, 0), {"lengths": "sharegpt", "num_system_prompts": 4, "session_gap": 2.0}),
        "docqa": ("docqa", (4, 60, 0), {}),
        "sysprompt": ("sysprompt", (3, 120, 0), {}),
    },
}


@functools.lru_cache(maxsize=8)
def make_trace(kind: str, args: tuple[int, int, int], kw: tuple[tuple[str, Any], ...]) -> list[dict[str, Any]]:
    return traces.GENERATORS[kind](*args, as_arrays=True, **dict(kw))  # type: ignore[operator]


def footprint_bytes(records: list[dict[str, Any]], kv_per_token: int) -> int:
    """KV bytes of every distinct prefix in the trace (all input+output sequences)."""
    tree = RadixTree()
    for r in records:
        tree.insert(np.concatenate([r["input_tokens"], r["output_tokens"]]))
    return sum(int(n.tokens.size) for n in tree.nodes()) * kv_per_token


def job(args: tuple[str, tuple[Any, ...], int, str, tuple[float, ...]]) -> dict[str, Any]:
    trace_name, spec_key, total, policy, grid = args
    kind, targs, kw = spec_key
    geo = get_preset(MODEL)
    spec = {s.name: s for s in baseline_specs(geo, grid=grid)}[policy]
    recs = make_trace(kind, targs, kw)
    res = run_spec(recs, spec, geo, total, base=BASE)
    row = res.row()
    row["trace"] = trace_name
    return row


def eviction_microbench(n_sessions: int = 60) -> dict[str, float]:
    """Time per eviction: incremental index vs full walk, on the same large tree."""
    from hybrid_connector.core.config import load_config
    from hybrid_connector.policies.eviction.marconi import MarconiEviction
    from hybrid_connector.policies.eviction.marconi_fullwalk import FullWalkMarconi
    from hybrid_connector.runtime.simulator import Simulator
    from hybrid_connector.tiers.size_only import Budget

    geo = get_preset(MODEL)
    cfg = load_config(None, {"chunk_size": 256, "hash_block_size": 256, "alignment": 1}, environ={})
    recs = traces.multi_turn_chat(n_sessions, 8, 1, lengths="sharegpt", num_system_prompts=8,
                                  as_arrays=True)
    inc = MarconiEviction(alpha=1.0)
    sim = Simulator(cfg, geo, Budget.pooled(10**15), eviction=inc)  # no eviction while building
    for r in recs:
        sim.step(r["input_tokens"], r["output_tokens"])
    ref = FullWalkMarconi(alpha=1.0)
    ref.bind(sim.cache.tree, geo, sim.cache.index.reclaim.evictable)
    ref._now = inc._now
    out: dict[str, float] = {"nodes": float(len(sim.cache.tree))}
    for kind in (ObjectKind.KV, ObjectKind.STATE):
        reps = 200
        t0 = time.perf_counter()
        for _ in range(reps):
            a = inc._choose(kind)
        t_inc = (time.perf_counter() - t0) / reps
        t0 = time.perf_counter()
        for _ in range(reps // 10):
            b = ref._choose(kind)
        t_ref = (time.perf_counter() - t0) / (reps // 10)
        assert a is b, "incremental and full walk disagree"
        out[f"{kind.value}_incremental_us"] = t_inc * 1e6
        out[f"{kind.value}_full_walk_us"] = t_ref * 1e6
        out[f"{kind.value}_speedup"] = t_ref / t_inc
    return out


def write_outputs(rows: list[dict[str, Any]], stem: Path, order: list[str]) -> None:
    cols = ["trace", "budget_gib", "policy", "token_hit_rate", "approx_share", "request_hit_rate",
            "flops_saved_frac", "ttft_p50_ms", "ttft_p95_ms", "alpha", "states_saved", "wall_s"]
    table = []
    for r in rows:
        table.append({
            "trace": r["trace"], "budget_gib": round(r["budget_bytes"] / 2**30, 2),
            "policy": r["policy"], "token_hit_rate": round(r["token_hit_rate"], 4),
            "approx_share": round(r["approx_hit_tokens"] / max(1, r["prompt_tokens"]), 4),
            "request_hit_rate": round(r["request_hit_rate"], 4),
            "flops_saved_frac": round(r["flops_saved_frac"], 4),
            "ttft_p50_ms": round(1e3 * r["ttft_p50"], 1), "ttft_p95_ms": round(1e3 * r["ttft_p95"], 1),
            "alpha": "" if r["alpha"] is None else r["alpha"], "states_saved": r["states_saved"],
            "wall_s": round(r["wall_s"], 2),
        })
    table.sort(key=lambda t: (t["trace"], t["budget_gib"], order.index(t["policy"])))
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(table)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(t[c]) for c in cols) + " |" for t in table]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(table, stem.with_suffix(".png"), order)


def plot(table: list[dict[str, Any]], path: Path, order: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({t["trace"] for t in table})
    fig, axes = plt.subplots(2, len(names), figsize=(4.2 * len(names), 7), squeeze=False)
    for j, trace in enumerate(names):
        for pol in order:
            pts = sorted((t["budget_gib"], t["token_hit_rate"], t["flops_saved_frac"])
                         for t in table if t["trace"] == trace and t["policy"] == pol)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            axes[0][j].plot(xs, [p[1] for p in pts], marker="o", label=pol)
            axes[1][j].plot(xs, [p[2] for p in pts], marker="o", label=pol)
        axes[0][j].set_title(trace)
        axes[1][j].set_xlabel("cache size (GiB)")
    axes[0][0].set_ylabel("token hit rate")
    axes[1][0].set_ylabel("FLOPs saved (fraction of prompt FLOPs)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ordering_report(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r_size in sorted({r["budget_bytes"] for r in rows if r["trace"] == "agentic"}):
        at = {r["policy"]: r for r in rows if r["trace"] == "agentic" and r["budget_bytes"] == r_size}
        f = {k: v["flops_saved_frac"] for k, v in at.items()}
        checks = {
            "oracle >= marconi": f["oracle"] >= f["marconi"] - 1e-9,
            "marconi > sglang": f["marconi"] > f["sglang"],
            "sglang >> vllm_block (2x)": f["sglang"] >= 2 * f["vllm_block"],
            "default >= marconi": f["default"] >= f["marconi"] - 1e-9,
        }
        out.append(f"agentic @ {r_size / 2**30:.2f} GiB (FLOPs saved): "
                   + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in checks.items())
                   + "  [" + ", ".join(f"{k}={v:.3f}" for k, v in sorted(f.items())) + "]")
    return out


def gap_job(args: tuple[str, tuple[Any, ...], int, str]) -> dict[str, Any]:
    from policy_gaps import run_variant

    trace_name, key, total, variant = args
    row = run_variant(make_trace(*key), variant, total)
    row["trace"] = trace_name
    return row


def progress(it: Any, total: int, desc: str) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return it
    return tqdm(it, total=total, desc=desc)


def run_gaps(args: argparse.Namespace) -> int:
    import json

    import policy_gaps as pg

    traces_ = pg.TRACES_QUICK if args.quick else pg.TRACES_FULL
    geo = get_preset(MODEL)
    jobs = []
    for name, (kind, targs, kw) in traces_.items():
        key = (kind, targs, tuple(sorted(kw.items())))
        recs = make_trace(*key)
        foot = footprint_bytes(recs, geo.kv_bytes_per_token())
        print(f"trace {name}: {len(recs)} requests, footprint {foot / 2**30:.2f} GiB")
        for frac in pg.FRACTIONS.get(name, pg.FRACTIONS["*"]):
            jobs += [(name, key, int(foot * frac), v) for v in pg.variants(name)
                     if not args.only or v in args.only.split(",")]
    jobs.sort(key=lambda j: j[3] not in ("vllm_block", "default", "default_shared", "marconi",
                                         "marconi_joint", "marconi_window"))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(progress(pool.map(gap_job, jobs), len(jobs), "simulations"))
    print(f"{len(jobs)} simulations in {time.perf_counter() - t0:.1f}s")
    gaps = pg.gap_rows(rows) if not args.only else []
    blocks, anchors, placement = pg.per_block_rows(rows), pg.anchor_rows(rows), pg.placement_rows(rows)
    name = args.stem or ("policy_gaps_quick" if args.quick else "policy_gaps")
    stem = Path(args.out) / name
    stem.parent.mkdir(parents=True, exist_ok=True)
    md = pg.markdown(gaps, blocks, anchors, placement)
    stem.with_suffix(".md").write_text(md)
    stem.with_suffix(".json").write_text(json.dumps(
        {"gaps": gaps, "per_block": blocks, "anchors": anchors, "placement": placement, "rows": [{k: v for k, v in r.items()} for r in rows]},
        indent=1, default=str))
    if gaps:
        pg.plot(gaps, stem.with_suffix(".png"))
    print(md)
    print(f"wrote {stem}.json, .md, .png")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small traces (a few minutes on 2 cores)")
    ap.add_argument("--suite", choices=("gaps", "baselines", "all"), default="gaps")
    ap.add_argument("--only", default="", help="gaps suite: only these variants (comma list)")
    ap.add_argument("--stem", default="", help="gaps suite: output file stem")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    if args.suite in ("gaps", "all"):
        run_gaps(args)
        if args.suite == "gaps":
            return 0
    setup = QUICK if args.quick else FULL
    geo = get_preset(MODEL)
    grid = setup["grid"]
    order = [s.name for s in baseline_specs(geo, grid=grid)]
    jobs = []
    for name, (kind, targs, kw) in setup["traces"].items():
        key = (kind, targs, tuple(sorted(kw.items())))
        recs = make_trace(*key)
        foot = footprint_bytes(recs, geo.kv_bytes_per_token())
        summ = traces.summarize(recs)
        print(f"trace {name}: {summ['requests']} requests, mean input {summ['mean_input']:.0f} tokens, "
              f"footprint {foot / 2**30:.2f} GiB")
        fracs = setup["fractions"]
        for frac in fracs.get(name, fracs["*"]):  # type: ignore[attr-defined]
            for pol in order:
                jobs.append((name, key, int(foot * frac), pol, grid))
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    # Longest jobs first so the pool stays busy.
    jobs.sort(key=lambda j: (j[3] not in ("vllm_block", "oracle", "default"), -j[2]))
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        it = pool.map(job, jobs)
        for row in (tqdm(it, total=len(jobs), desc="simulations") if tqdm else it):
            rows.append(row)
    print(f"{len(jobs)} simulations in {time.perf_counter() - t0:.1f}s")
    stem = Path(args.out) / ("policies_quick" if args.quick else "policies")
    stem.parent.mkdir(parents=True, exist_ok=True)
    write_outputs(rows, stem, order)
    print("\n".join(ordering_report(rows)))
    mb = eviction_microbench(60 if args.quick else 200)
    print(f"eviction micro-benchmark on {mb['nodes']:.0f} nodes: "
          f"KV {mb['kv_incremental_us']:.1f} us incremental vs {mb['kv_full_walk_us']:.1f} us full walk "
          f"({mb['kv_speedup']:.1f}x); STATE {mb['state_incremental_us']:.1f} vs "
          f"{mb['state_full_walk_us']:.1f} us ({mb['state_speedup']:.1f}x); same victims: yes")
    print(f"wrote {stem}.csv, .md, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
