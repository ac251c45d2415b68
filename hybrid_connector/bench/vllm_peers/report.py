"""What ``hybrid-connector bench vllm-peers`` prints and writes: a table per trace (hit rate,
tokens recomputed, bytes held per hit token, scheduler ms per step, per budget and peer),
a summary of who wins by how much at each budget, the JSON document and a plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hybrid_connector.bench.vllm_peers.setups import LABELS

HOST_PEERS = ("offload-lru", "offload-arc", "simple")  # vLLM's own host-tier connectors


def _cell(r: dict[str, Any]) -> str:
    bph = r["bytes_per_hit_token"]
    return (f"{r['hit_rate']:6.3f} {r['recomputed']:>9,} {bph if bph is None else round(bph):>7} "
            f"{r['sched_ms_mean']:6.2f} {r['sched_ms_p99']:6.2f}")


def table(doc: dict[str, Any], trace: str) -> str:
    """One trace's rows: per budget and peer the five figures."""
    t = doc["traces"][trace]
    rows = [r for r in doc["rows"] if r["trace"] == trace]
    head = (f"{trace}: {t['requests']:,} requests, {t['prompt_tokens']:,} prompt tokens, live-peak "
            f"working set {t['working_set_bytes'] / 1e6:.2f} MB, device cache {t['device_blocks']} "
            f"blocks ({t['device_bytes'] / 1e6:.1f} MB)")
    lines = [head, f"  {'host budget':>16s}  {'connector':28s} {'hit':>6s} {'recomputed':>9s} "
                   f"{'B/hit':>7s} {'ms/st':>6s} {'p99':>6s}"]
    for r in sorted(rows, key=lambda r: (r["multiple"] or 0, list(LABELS).index(r["peer"]))):
        b = ("any" if r["multiple"] is None
             else f"{r['multiple']:g}x ({r['budget'] / 1e6:.2f} MB)")
        lines.append(f"  {b:>16s}  {LABELS[r['peer']]:28s} {_cell(r)}")
    return "\n".join(lines)


def verdicts(doc: dict[str, Any]) -> list[str]:
    """Per trace and budget: ours against the best of vLLM's host-tier connectors."""
    out = []
    for trace in doc["traces"]:
        rows = [r for r in doc["rows"] if r["trace"] == trace and r["multiple"] is not None]
        for m in sorted({r["multiple"] for r in rows}):
            at = {r["peer"]: r for r in rows if r["multiple"] == m}
            peers = [at[p] for p in HOST_PEERS if p in at]
            if not peers:
                continue
            best = max(peers, key=lambda r: r["hit_rate"])
            for name in ("ours", "ours-pooled"):
                if name not in at:
                    continue
                ours = at[name]
                d = ours["hit_rate"] - best["hit_rate"]
                who = (f"{LABELS[name]} wins" if d > 0.0005 else
                       "tie" if abs(d) <= 0.0005 else f"{LABELS[best['peer']]} wins")
                rec = (ours["recomputed"] / best["recomputed"]) if best["recomputed"] else float("nan")
                out.append(f"  {trace:15s} {m:>4g}x {LABELS[name]:30s}: {who:34s} hit rate "
                           f"{ours['hit_rate']:.3f} vs {best['hit_rate']:.3f} ({d:+.3f}); "
                           f"recomputed x{rec:.2f}; sched {ours['sched_ms_mean']:.2f} vs "
                           f"{best['sched_ms_mean']:.2f} ms/step")
    return out


def text(doc: dict[str, Any]) -> str:
    """The whole report (what the command prints and the .txt holds)."""
    g = doc["geometry"]
    parts = [
        f"vLLM {doc['vllm']} Scheduler on CPU, {g['preset']} scaled by 1/{g['divisor']:g} "
        f"(block {g['block']} tokens = {g['real_block']} / {g['divisor']:g}; KV "
        f"{g['kv_bytes_per_token']} B/token, one state {g['state_bytes']:,} B = KV of "
        f"{g['state_bytes'] / g['kv_bytes_per_token']:.0f} tokens), dense retention, "
        f"{doc['config']['concurrency']} requests at once.",
        "Every hit decided by vLLM's code; the only stand-in is the workers' GPU copy routine "
        "(a CPU copy); every restored byte checked by the runner.",
        "Columns: token hit rate (vLLM's local + external hit at each request's first "
        "schedule), prompt tokens recomputed, host bytes held per hit token (peak), "
        "schedule()+update_from_output() ms per step (mean, p99).", ""]
    for trace in doc["traces"]:
        parts += [table(doc, trace), ""]
    v = verdicts(doc)
    if v:
        parts += ["Ours against the best of vLLM's host-tier connectors (same host bytes):", *v]
    return "\n".join(parts)


def markdown(doc: dict[str, Any]) -> str:
    """Token hit rates as a Markdown table: one row per trace and budget, one column per
    connector (the best marked bold; vLLM's prefix cache alone in every row)."""
    peers = [p for p in LABELS if p in doc["peers"]]
    head = "| trace | host budget | " + " | ".join(LABELS[p] for p in peers) + " |"
    lines = [head, "|" + "---|" * (len(peers) + 2)]
    for trace in doc["traces"]:
        rows = [r for r in doc["rows"] if r["trace"] == trace]
        base = next((r for r in rows if r["peer"] == "none"), None)
        for m in sorted({r["multiple"] for r in rows if r["multiple"] is not None}):
            at = {r["peer"]: r for r in rows if r["multiple"] == m}
            if base is not None:
                at["none"] = base
            best = max(round(r["hit_rate"], 3) for r in at.values())
            cells = [("**%.3f**" if round(at[p]["hit_rate"], 3) == best else "%.3f") % at[p]["hit_rate"]
                     if p in at else "" for p in peers]
            lines.append(f"| {trace} | {m:g}x | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")


def plot(path: Path, doc: dict[str, Any]) -> str | None:
    """Hit rate against the host budget, one panel per trace; None or why not written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # matplotlib is an optional extra
        return f"matplotlib not available ({exc})"
    traces = list(doc["traces"])
    fig, axes = plt.subplots(1, len(traces), figsize=(4.2 * len(traces), 3.6), squeeze=False)
    style = {"offload-lru": ("tab:blue", "--"), "offload-arc": ("tab:cyan", "--"),
             "simple": ("tab:green", ":"), "ours": ("tab:red", "-"),
             "ours-pooled": ("tab:orange", "-")}
    for ax, trace in zip(axes[0], traces, strict=True):
        rows = [r for r in doc["rows"] if r["trace"] == trace]
        for peer, (color, ls) in style.items():
            pts = sorted((r["multiple"], r["hit_rate"]) for r in rows if r["peer"] == peer)
            if pts:
                ax.plot(*zip(*pts, strict=True), ls, marker="o", color=color, label=LABELS[peer])
        base = [r["hit_rate"] for r in rows if r["peer"] == "none"]
        if base:
            ax.axhline(base[0], color="grey", lw=1, label=LABELS["none"])
        ax.set_xscale("log", base=2)
        ms = sorted({r["multiple"] for r in rows if r["multiple"] is not None})
        ax.set_xticks(ms, [f"{m:g}x" for m in ms])
        ax.minorticks_off()
        ax.set_title(trace)
        ax.set_xlabel("host budget / live-peak working set")
        ax.set_ylabel("token hit rate")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"vLLM {doc['vllm']} Scheduler, same device blocks and host bytes "
                 f"({doc['geometry']['preset']} scaled)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
