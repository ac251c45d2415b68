"""The capacity benchmark's outputs: a table, the JSON file and the PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MB = 1e6


def _mb(d: dict[str, dict[str, int]]) -> str:
    return " ".join(f"{t}:{sum(k.values()) / MB:.1f}" for t, k in d.items() if sum(k.values())) or "-"


def table(rows: list[dict[str, Any]], workload: str, ratio: float, scaled: bool = True) -> str:
    """The rows of ``workload`` at ``ratio`` (every configuration) as a text table;
    ``scaled``: the bytes are the benchmark's scaled-down ones."""
    loaded = "loaded MB by tier (scaled)" if scaled else "loaded MB by tier         "
    head = (f"{'configuration':22} {'tok hit':>7} {'req hit':>7} {'TTFT ms':>8} {'p95 ms':>7} "
            f"{'req/s':>7} {'x dev-LRU':>9}  {loaded}   hits by tier")
    out = [head, "-" * len(head)]
    base = next((r for r in rows if r["workload"] == workload and r["ratio"] == ratio
                 and r["config"] == "device-lru"), None)
    for r in rows:
        if r["workload"] != workload or r["ratio"] != ratio:
            continue
        x = r["throughput_rps"] / base["throughput_rps"] if base and base["throughput_rps"] else 0.0
        hits = " ".join(f"{t}:{n}" for t, n in r["hits_by_tier"].items()) or "-"
        out.append(f"{r['config']:22} {r['token_hit_rate']:7.3f} {r['request_hit_rate']:7.3f} "
                   f"{r['ttft_mean_s'] * 1e3:8.1f} {r['ttft_p95_s'] * 1e3:7.1f} "
                   f"{r['throughput_rps']:7.2f} {x:9.2f}  {_mb(r['loaded_bytes']):27} {hits}")
    return "\n".join(out)


def markdown(rows: list[dict[str, Any]], workload: str, ratio: float) -> str:
    """The same table in Markdown (for the README)."""
    base = next((r for r in rows if r["workload"] == workload and r["ratio"] == ratio
                 and r["config"] == "device-lru"), None)
    out = ["| configuration | token hit rate | request hit rate | mean TTFT (ms) | p95 TTFT (ms) "
           "| req/s | x device-LRU | hits by tier |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["workload"] != workload or r["ratio"] != ratio:
            continue
        x = r["throughput_rps"] / base["throughput_rps"] if base and base["throughput_rps"] else 0.0
        hits = ", ".join(f"{t} {n}" for t, n in r["hits_by_tier"].items()) or "-"
        out.append(f"| {r['config']} | {r['token_hit_rate']:.3f} | {r['request_hit_rate']:.3f} | "
                   f"{r['ttft_mean_s'] * 1e3:.1f} | {r['ttft_p95_s'] * 1e3:.1f} | "
                   f"{r['throughput_rps']:.2f} | {x:.2f} | {hits} |")
    return "\n".join(out)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str))


def plot(path: Path, rows: list[dict[str, Any]], workloads: list[str], title: str) -> str | None:
    """Token hit rate and throughput against working set / device budget, one column per
    workload; returns why not when matplotlib is missing (None when written)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"matplotlib is not installed ({exc})"
    fig, axes = plt.subplots(2, len(workloads), figsize=(6.2 * len(workloads), 7.5), squeeze=False)
    configs = list(dict.fromkeys(r["config"] for r in rows))
    styles = {c: ("--" if c.endswith("lru") or c == "vllm-block" else "-") for c in configs}
    for j, w in enumerate(workloads):
        for c in configs:
            pts = sorted((r["ratio"], r["token_hit_rate"], r["throughput_rps"]) for r in rows
                         if r["workload"] == w and r["config"] == c)
            if not pts:
                continue
            xs = [p[0] for p in pts]  # the last configuration's ticks label every axis
            axes[0][j].plot(xs, [p[1] for p in pts], styles[c], marker="o", label=c)
            axes[1][j].plot(xs, [p[2] for p in pts], styles[c], marker="o", label=c)
        for i, lab in enumerate(("token hit rate", "throughput (requests/s, prefill-bound)")):
            ax = axes[i][j]
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [f"{x:g}x" for x in xs])
            ax.set_xlabel("working set / device budget")
            ax.set_ylabel(lab)
            ax.grid(True, alpha=0.3)
        axes[0][j].set_title(f"{w}")
        axes[0][j].set_ylim(0, 1)
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
