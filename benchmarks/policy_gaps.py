"""Policies v2 sweep: auto alpha against LRU and the best fixed alpha, and per-block vLLM.

Used by ``benchmarks/policies.py`` (``--suite gaps``). For every trace family and three
cache sizes it runs, through the real ``HybridCache`` over size-only tiers: LRU with path
refresh (SGLang-style, ``sglang``), Marconi at every fixed alpha of the shadow grid (the
best of them is the "best fixed alpha in hindsight"), auto alpha with the shadow tuner
(``marconi``), auto alpha with the v1 window tuner (``marconi_window``, the tuner without
this issue's change) and the shadow tuner with ``pooled_eviction: utility``
(``marconi_joint``). On the agentic family it adds vLLM-style per-block checkpointing
(block 32, LRU); on agentic, one-shot chat and chat ``default`` (placement + anchors,
replayed hits counted apart) with and without ``anchor_admission: shared``.

Per row (token hit rate): each tuner against LRU in points and against the best fixed alpha
as a ratio, all measured in the same run.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.policies.tuning.shadow import DEFAULT_ALPHAS
from hybrid_connector.sim.baselines import PolicySpec, baseline_specs
from hybrid_connector.sim.simulate import run_once

MODEL = "marconi-7b"
BASE = {"alpha_objective": "token_hits", "bootstrap_multiplier": 5, "retune_interval": 100}
VARIANTS = ("lru", *(f"alpha={a:g}" for a in DEFAULT_ALPHAS),
            *(f"xalpha={a:g}" for a in DEFAULT_ALPHAS if a > 0), "marconi", "marconi_window",
            "marconi_joint")
AGENTIC_ONLY = ("vllm_block",)
ANCHOR_TRACES = ("agentic", "oneshot", "chat")  # default with and without anchor_admission: shared
ANCHOR_VARIANTS = ("default", "default_shared")
PLACEMENT_TRACES = ("agentic", "docqa", "sysprompt")  # placement on one prefix vs over the tree
PLACEMENT_VARIANTS = ("placement", "placement_tree")
PLACEMENT_ALPHA = 2.0
TRACES_FULL = {
    "agentic": ("agentic", (10, 20, 0), {"sessions_per_second": 1.0, "side_calls": 2.0}),
    "chat": ("chat", (24, 10, 0), {"lengths": "sharegpt", "num_system_prompts": 4, "session_gap": 2.0}),
    "docqa": ("docqa", (6, 150, 0), {}),
    "sysprompt": ("sysprompt", (4, 250, 0), {}),
    "oneshot": ("oneshot", (800, 3, 0), {}),
}
TRACES_QUICK = {
    "agentic": ("agentic", (6, 12, 0), {"sessions_per_second": 1.0, "side_calls": 2.0}),
    "chat": ("chat", (12, 8, 0), {"lengths": "sharegpt", "num_system_prompts": 4, "session_gap": 2.0}),
    "docqa": ("docqa", (3, 60, 0), {}),
    "sysprompt": ("sysprompt", (3, 100, 0), {}),
    "oneshot": ("oneshot", (300, 3, 0), {}),
}
FRACTIONS = {"agentic": (0.03, 0.06, 0.12), "*": (0.1, 0.25, 0.5)}


def variants(trace: str) -> tuple[str, ...]:
    return (VARIANTS + (AGENTIC_ONLY if trace == "agentic" else ())
            + (ANCHOR_VARIANTS if trace in ANCHOR_TRACES else ())
            + (PLACEMENT_VARIANTS if trace in PLACEMENT_TRACES else ()))


def _fixed(spec: PolicySpec, **over: Any) -> PolicySpec:
    """``spec`` with ``over`` in its own overrides (a spec's overrides win over ``base``,
    so a fixed alpha given as ``base`` would leave an auto spec tuning)."""
    return dataclasses.replace(spec, overrides={**spec.overrides, **over})


def run_variant(records: list[dict[str, Any]], variant: str, total: int) -> dict[str, Any]:
    """One simulation; the row of ``SimResult.row()`` plus ``variant``."""
    geo = get_preset(MODEL)
    # No grid: the shadow tuner keeps its own (DEFAULT_ALPHAS, extended while the top leads);
    # the v1 window tuner is given the same alphas explicitly.
    specs = {s.name: s for s in baseline_specs(geo, include_reference=False)}
    base: dict[str, Any] = dict(BASE)
    if variant == "marconi_window":
        base["alpha_grid"] = DEFAULT_ALPHAS
    alpha = None
    if variant == "lru":
        spec = specs["sglang"]
    elif variant.startswith("alpha="):
        spec, alpha = specs["marconi"], float(variant.split("=", 1)[1])
    elif variant.startswith("xalpha="):
        spec = _fixed(specs["marconi"], alpha=float(variant.split("=", 1)[1]), marconi_score="product")
    elif variant == "marconi_joint":
        spec, base["pooled_eviction"] = specs["marconi"], "utility"
    elif variant in PLACEMENT_VARIANTS:  # at one fixed alpha, so placement alone differs
        spec = _fixed(specs["placement"], alpha=PLACEMENT_ALPHA, placement_tree=variant.endswith("tree"))
    elif variant == "default_shared":
        spec, base["anchor_admission"] = specs["default"], "shared"
    else:
        spec = specs[variant]
    t0 = time.perf_counter()
    res = run_once(records, spec, geo, total, alpha=alpha, base=base)
    row = res.row()
    row.update(variant=variant, wall_s=time.perf_counter() - t0)
    return row


def gap_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (trace, size): LRU, best fixed, the tuners, and each tuner's gap to LRU
    (points) and to the best fixed alpha (percent, and as a ratio), all from this run."""
    out = []
    for key in sorted({(r["trace"], r["budget_bytes"]) for r in rows}):
        at = {r["variant"]: r for r in rows if (r["trace"], r["budget_bytes"]) == key}
        fixed = {v: r["token_hit_rate"] for v, r in at.items() if "alpha=" in v}
        best_v = max(fixed, key=lambda v: (fixed[v], -float(v.split("=")[1])))
        sums = {v: f for v, f in fixed.items() if v.startswith("alpha=")}
        lru, best = at["lru"]["token_hit_rate"], fixed[best_v]
        line: dict[str, Any] = {"trace": key[0], "budget_gib": round(key[1] / 2**30, 2),
                                "lru": lru, "best_fixed": best,
                                "best_alpha": best_v.replace("xalpha=", "x").replace("alpha=", ""),
                                "best_sum_fixed": max(sums.values())}
        for name in ("marconi", "marconi_window", "marconi_joint"):
            v = at[name]["token_hit_rate"]
            vs_lru = 100 * (v - lru)
            vs_best = 100 * (v - best) / best if best > 0 else 0.0
            line[name] = v
            line[f"{name}_vs_lru_pts"] = round(vs_lru, 2)
            line[f"{name}_vs_best_pct"] = round(vs_best, 1)
            line[f"{name}_over_best"] = round(v / best, 3) if best > 0 else 1.0
            line[f"{name}_switches"] = len(at[name].get("alpha_history") or [])
        fixed_wall = float(np.mean([at[v]["wall_s"] for v in fixed]))
        line["tuning_ms_per_request"] = round(
            1e3 * max(0.0, at["marconi"]["wall_s"] - fixed_wall) / max(1, at["marconi"]["requests"]), 2)
        out.append(line)
    return out


def per_block_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Agentic: token hit rate against vLLM-style per-block (32, LRU) at equal bytes."""
    out = []
    for size in sorted({r["budget_bytes"] for r in rows if r["trace"] == "agentic"}):
        at = {r["variant"]: r for r in rows if r["trace"] == "agentic" and r["budget_bytes"] == size}
        if not all(v in at for v in ("vllm_block", "marconi", "default")):
            continue
        vb = at["vllm_block"]["token_hit_rate"]
        d = at["default"]
        replayed = d["approx_hit_tokens"] / max(1, d["prompt_tokens"])
        exact = d["token_hit_rate"] - replayed
        out.append({
            "budget_gib": round(size / 2**30, 2), "vllm_block": vb,
            "marconi_exact": at["marconi"]["token_hit_rate"],
            "ratio_marconi": at["marconi"]["token_hit_rate"] / vb if vb else float("inf"),
            "default_exact": exact, "default_replayed": replayed,
            "ratio_default_exact": exact / vb if vb else float("inf"),
            "ratio_default_all": d["token_hit_rate"] / vb if vb else float("inf"),
        })
    return out


def placement_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sparse placement keyed by one prefix vs projected over the tree, and no placement,
    all at alpha ``PLACEMENT_ALPHA``."""
    out = []
    for key in sorted({(r["trace"], r["budget_bytes"]) for r in rows if r["variant"] in PLACEMENT_VARIANTS}):
        at = {r["variant"]: r for r in rows if (r["trace"], r["budget_bytes"]) == key}
        if not all(v in at for v in PLACEMENT_VARIANTS):
            continue
        line: dict[str, Any] = {"trace": key[0], "budget_gib": round(key[1] / 2**30, 2)}
        for v in (f"alpha={PLACEMENT_ALPHA:g}", *PLACEMENT_VARIANTS):
            if v in at:
                line[v] = at[v]["token_hit_rate"]
                line[f"{v}_flops"] = at[v]["flops_saved_frac"]
                line[f"{v}_states"] = at[v]["states_saved"]
        out.append(line)
    return out


def anchor_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``default`` with every computed anchor page vs only pages inside shared tokens."""
    out = []
    for key in sorted({(r["trace"], r["budget_bytes"]) for r in rows if r["variant"] in ANCHOR_VARIANTS}):
        at = {r["variant"]: r for r in rows if (r["trace"], r["budget_bytes"]) == key}
        line: dict[str, Any] = {"trace": key[0], "budget_gib": round(key[1] / 2**30, 2)}
        for v in ANCHOR_VARIANTS:
            r = at[v]
            replayed = r["approx_hit_tokens"] / max(1, r["prompt_tokens"])
            line[f"{v}_exact"] = r["token_hit_rate"] - replayed
            line[f"{v}_replayed"] = replayed
            line[f"{v}_anchor_gb"] = r["stored_bytes"].get("anchor", 0) / 1e9
            line[f"{v}_flops_saved"] = r["flops_saved_frac"]
        out.append(line)
    return out


def summary_line(gaps: list[dict[str, Any]], name: str, label: str) -> str:
    """One tuner over every row: its token hit rate against the best fixed alpha (ratio) and
    against LRU (points), median and worst, with the worst row named."""
    worst = min(gaps, key=lambda g: g[f"{name}_over_best"])
    worst_lru = min(gaps, key=lambda g: g[f"{name}_vs_lru_pts"])
    ratios = [g[f"{name}_over_best"] for g in gaps]
    pts = [g[f"{name}_vs_lru_pts"] for g in gaps]
    return (f"{label}, {len(gaps)} rows: token hit rate / best fixed alpha's, median "
            f"{float(np.median(ratios)):.3f}x, worst {worst[f'{name}_over_best']:.3f}x "
            f"({worst['trace']} {worst['budget_gib']} GiB); vs LRU median "
            f"{float(np.median(pts)):+.2f} points, worst {worst_lru[f'{name}_vs_lru_pts']:+.2f} "
            f"({worst_lru['trace']} {worst_lru['budget_gib']} GiB)")


def markdown(gaps: list[dict[str, Any]], blocks: list[dict[str, Any]],
             anchors: list[dict[str, Any]] | None = None,
             placement: list[dict[str, Any]] | None = None) -> str:
    """Both tables, as the benchmark prints and writes them."""
    cols = ["trace", "GiB", "LRU", "best fixed (alpha)", "auto (shadow)", "vs LRU (pts)",
            "vs best (%)", "shadow / best", "auto (window, v1)", "v1 vs LRU", "v1 vs best",
            "v1 / best", "shadow + joint pool", "joint vs LRU", "tuning ms/request"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] if gaps else []
    for g in gaps:
        lines.append("| " + " | ".join(str(x) for x in (
            g["trace"], g["budget_gib"], f"{g['lru']:.4f}", f"{g['best_fixed']:.4f} ({g['best_alpha']})",
            f"{g['marconi']:.4f}", g["marconi_vs_lru_pts"], g["marconi_vs_best_pct"],
            f"{g['marconi_over_best']:.3f}x",
            f"{g['marconi_window']:.4f}", g["marconi_window_vs_lru_pts"], g["marconi_window_vs_best_pct"],
            f"{g['marconi_window_over_best']:.3f}x",
            f"{g['marconi_joint']:.4f}", g["marconi_joint_vs_lru_pts"], g["tuning_ms_per_request"])) + " |")
    if gaps:
        lines += ["", *(summary_line(gaps, name, label) for name, label in (
            ("marconi", "auto alpha (shadow tuner)"), ("marconi_window", "auto alpha (v1 window tuner)")))]
    if blocks:
        lines += ["", "| GiB | vLLM per-block (32, LRU) | Marconi exact | ratio | default exact | "
                  "default replayed | ratio exact | ratio exact+replayed |", "|---|---|---|---|---|---|---|---|"]
        for b in blocks:
            lines.append(f"| {b['budget_gib']} | {b['vllm_block']:.4f} | {b['marconi_exact']:.4f} | "
                         f"{b['ratio_marconi']:.2f}x | {b['default_exact']:.4f} | {b['default_replayed']:.4f} | "
                         f"{b['ratio_default_exact']:.2f}x | {b['ratio_default_all']:.2f}x |")
    if placement:
        lines += ["", f"| trace | GiB | Marconi alpha {PLACEMENT_ALPHA:g} | placement (one prefix) | FLOPs saved | states | "
                  "placement (tree) | FLOPs saved | states |", "|" + "---|" * 9]
        for p in placement:
            lines.append("| " + " | ".join([p["trace"], str(p["budget_gib"]),
                                            f"{p[f'alpha={PLACEMENT_ALPHA:g}']:.4f}"
                                            if f"alpha={PLACEMENT_ALPHA:g}" in p else "-"] + [
                f"{p[f'{v}{k}']:.4f}" if k != "_states" else str(p[f"{v}{k}"])
                for v in PLACEMENT_VARIANTS for k in ("", "_flops", "_states")]) + " |")
    if anchors:
        lines += ["", "| trace | GiB | all pages: exact | replayed | anchor GB written | FLOPs saved | "
                  "shared only: exact | replayed | anchor GB written | FLOPs saved |", "|" + "---|" * 10]
        for a in anchors:
            lines.append("| " + " | ".join([a["trace"], str(a["budget_gib"])] + [
                f"{a[f'{v}_{k}']:.4f}" for v in ANCHOR_VARIANTS
                for k in ("exact", "replayed", "anchor_gb", "flops_saved")]) + " |")
    return "\n".join(lines) + "\n"


def plot(gaps: list[dict[str, Any]], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({g["trace"] for g in gaps})
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.4), squeeze=False)
    for ax, trace in zip(axes[0], names, strict=True):
        pts = sorted((g for g in gaps if g["trace"] == trace), key=lambda g: g["budget_gib"])
        xs = [g["budget_gib"] for g in pts]
        for key, label, style in (("lru", "LRU", "k--"), ("best_fixed", "best fixed alpha", "g:"),
                                  ("marconi", "auto (shadow)", "b-o"), ("marconi_window", "auto (window, v1)", "r-x")):
            ax.plot(xs, [g[key] for g in pts], style, label=label)
        ax.set_title(trace)
        ax.set_xlabel("cache size (GiB)")
    axes[0][0].set_ylabel("token hit rate")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
