"""What ``hybrid-connector bench vllm-peers`` prints and writes: a table per trace (hit rate,
tokens recomputed, host bytes held and written per hit token, modeled time to first token
and its ratio to the best of vLLM's host-tier connectors, scheduler ms per step, per budget
and peer), a summary of who wins by how much at each budget, the JSON document and a plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hybrid_connector.bench.vllm_peers.disk_report import compare
from hybrid_connector.bench.vllm_peers.disk_report import lines as disk_lines
from hybrid_connector.bench.vllm_peers.setups import LABELS
from hybrid_connector.bench.vllm_peers.ttft import best_vllm_ratios

HOST_PEERS = ("offload-lru", "offload-arc", "simple")  # vLLM's own host-tier connectors


def _num(x: float | None, fmt: str, width: int) -> str:
    return f"{'-' if x is None else format(x, fmt):>{width}}"


def _cell(r: dict[str, Any]) -> str:
    t = r.get("ttft")
    return (f"{r['hit_rate']:6.3f} {r['recomputed']:>10,} {_num(r['bytes_per_hit_token'], '.0f', 8)} "
            f"{_num(r.get('stored_bytes_per_hit_token'), '.0f', 8)} "
            f"{_num(t['mean_ms'] if t else None, '.1f', 8)} {_num(r.get('ttft_vs_best_vllm'), '.2f', 7)} "
            f"{r['sched_ms_mean']:6.2f} {r['sched_ms_p99']:6.2f}")


def table(doc: dict[str, Any], trace: str) -> str:
    """One trace's rows: per budget and peer the five figures."""
    t = doc["traces"][trace]
    rows = [r for r in doc["rows"] if r["trace"] == trace]
    head = (f"{trace}: {t['requests']:,} requests, {t['prompt_tokens']:,} prompt tokens, live-peak "
            f"working set {t['working_set_bytes'] / 1e6:.2f} MB, device cache {t['device_blocks']} "
            f"blocks ({t['device_bytes'] / 1e6:.1f} MB)")
    c = t.get("ceiling")
    if c:  # what no connector can beat (bench.vllm_peers.ceiling)
        head += (f"\n  best possible (an unlimited cache under vLLM's hit rules): hit rate "
                 f"{c['hit_rate']:.3f}, recomputed {c['recomputed']:,.0f}, modeled TTFT "
                 f"{c['ttft_ms']:.1f} ms")
    lines = [head, f"  {'host budget':>16s}  {'connector':30s} {'hit':>6s} {'recomputed':>10s} "
                   f"{'held/hit':>8s} {'wrtn/hit':>8s} {'TTFT ms':>8s} {'vs best':>7s} "
                   f"{'ms/st':>6s} {'p99':>6s}"]
    for r in sorted(rows, key=lambda r: (r["multiple"] or 0, list(LABELS).index(r["peer"]))):
        b = ("any" if r["multiple"] is None
             else f"{r['multiple']:g}x ({r['budget'] / 1e6:.2f} MB)")
        lines.append(f"  {b:>16s}  {LABELS[r['peer']]:30s} {_cell(r)}")
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
            for name in ("ours", "ours-pooled", "ours-shipped"):
                if name not in at:
                    continue
                ours = at[name]
                win, d, rec = compare(ours, best)
                who = {"ours": f"{LABELS[name]} wins", "tie": "tie",
                       "other": f"{LABELS[best['peer']]} wins"}[win]
                tt = ours.get("ttft_vs_best_vllm")
                ttft = "" if tt is None else f"; modeled TTFT x{tt:.2f}"
                out.append(f"  {trace:15s} {m:>4g}x {LABELS[name]:30s}: {who:34s} hit rate "
                           f"{ours['hit_rate']:.3f} vs {best['hit_rate']:.3f} ({d:+.3f}); "
                           f"recomputed x{rec:.2f}{ttft}; sched {ours['sched_ms_mean']:.2f} vs "
                           f"{best['sched_ms_mean']:.2f} ms/step")
    return out


def text(doc: dict[str, Any]) -> str:
    """The whole report (what the command prints and the .txt holds). Refreshes each row's
    ``ttft_vs_best_vllm`` first, so a document whose rows were merged from separate runs
    compares every row with the best vLLM connector among all of them."""
    if all("ttft" in r for r in doc["rows"]):
        best_vllm_ratios(doc["rows"], HOST_PEERS)
    g = doc["geometry"]
    parts = [
        f"vLLM {doc['vllm']} Scheduler on CPU, {g['preset']} scaled by 1/{g['divisor']:g} "
        f"(block {g['block']} tokens = {g['real_block']} / {g['divisor']:g}; KV "
        f"{g['kv_bytes_per_token']} B/token, one state {g['state_bytes']:,} B = KV of "
        f"{g['state_bytes'] / g['kv_bytes_per_token']:.0f} tokens), dense retention, "
        f"{doc['config']['concurrency']} requests at once"
        + ("; AsyncScheduler, two steps in flight, each request ending at its answer's last "
           "token as at an end-of-turn token." if doc["config"].get("async_scheduling") else ".")
        + (f" The engine thread idles {doc['config']['gpu_step_ms']:g} ms after each step, as it "
           "would wait on a GPU's forward pass." if doc["config"].get("gpu_step_ms") else ""),
        "Every hit decided by vLLM's code; the only stand-in is the workers' GPU copy routine "
        "(a CPU copy); every restored byte checked by the runner.",
        *_legend(doc), ""]
    for trace in doc["traces"]:
        parts += [table(doc, trace), ""]
    v = verdicts(doc)
    if v:
        parts += ["Ours against the best of vLLM's host-tier connectors (same host bytes):", *v]
    disk = disk_lines(doc)
    if disk:
        parts += ["", *disk]
    return "\n".join(parts)


def _legend(doc: dict[str, Any]) -> list[str]:
    """The column legend and, where the document has one, the TTFT model's figures."""
    out = [
        "Columns: hit = token hit rate (vLLM's local + external hit at each request's first "
        "schedule); recomputed = prompt tokens computed (a preempted request counts again);",
        "  held/hit = peak host bytes the connector held per hit token; wrtn/hit = bytes it "
        "wrote to the host tier over the run per hit token (both in the scaled model's bytes);",
        "  TTFT ms = mean modeled time to first token of the unscaled model (below); vs best = "
        "that over the lowest of vLLM's host-tier connectors at the same budget;",
        "  ms/st, p99 = schedule() + update_from_output() per step, mean and 99th percentile (ms of the scheduler thread's CPU time)."]
    m = doc.get("ttft_model")
    if m:
        per_tok = m["byte_factor"] / m["token_factor"]
        out += [
            f"Modeled TTFT: {m['model']} unscaled (tokens x{m['token_factor']:g}, bytes "
            f"x{m['byte_factor']:,.0f}) on an H200: prefill FLOPs at {m['peak_bf16_tflops']:g} "
            f"TFLOP/s BF16 dense x MFU {m['mfu']:g}, the connector's loads from pinned host memory "
            f"at {m['load_gbps']['host']:g} GB/s (PCIe Gen5 x16; bytes a disk tier served first "
            f"read at {m['load_gbps'].get('nvme', 0):g} GB/s), + {m['overhead_ms']:g} ms per "
            "request; compute and loads added, queueing not modeled.",
            f"  Full-size bytes per hit token are the held/hit and wrtn/hit figures x{per_tok:,.0f}."]
    return out


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


def _value(r: dict[str, Any], key: str) -> float:
    return float(r["ttft"]["mean_ms"] if key == "ttft" else r[key])


def plot(path: Path, doc: dict[str, Any]) -> str | None:
    """Hit rate (and, where the rows have it, mean modeled TTFT) against the host budget, one
    column of panels per trace; None or why not written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # matplotlib is an optional extra
        return f"matplotlib not available ({exc})"
    traces = list(doc["traces"])
    panels = [("hit_rate", "token hit rate")]
    if all("ttft" in r for r in doc["rows"]):
        panels.append(("ttft", "modeled TTFT, H200 (ms)"))
    fig, axes = plt.subplots(len(panels), len(traces), figsize=(4.2 * len(traces), 3.6 * len(panels)),
                             squeeze=False)
    style = {"offload-lru": ("tab:blue", "--"), "offload-arc": ("tab:cyan", "--"),
             "simple": ("tab:green", ":"), "ours": ("tab:red", "-"),
             "ours-pooled": ("tab:orange", "-"), "ours-shipped": ("tab:olive", "-"),
             "offload-fs": ("tab:purple", "-."),
             "ours-nvme": ("tab:brown", "-")}
    for row, (key, ylabel) in enumerate(panels):
        for ax, trace in zip(axes[row], traces, strict=True):
            rows = [r for r in doc["rows"] if r["trace"] == trace]
            for peer, (color, ls) in style.items():
                pts = sorted((r["multiple"], _value(r, key)) for r in rows if r["peer"] == peer)
                if pts:
                    ax.plot(*zip(*pts, strict=True), ls, marker="o", color=color, label=LABELS[peer])
            base = [_value(r, key) for r in rows if r["peer"] == "none"]
            if base:
                ax.axhline(base[0], color="grey", lw=1, label=LABELS["none"])
            c = doc["traces"][trace].get("ceiling")
            if c:  # the unlimited cache's figure: no connector gets past it
                ax.axhline(c["hit_rate"] if key == "hit_rate" else c["ttft_ms"], color="black",
                           lw=1, ls=(0, (1, 3)), label="best possible (unlimited cache)")
            ax.set_xscale("log", base=2)
            ms = sorted({r["multiple"] for r in rows if r["multiple"] is not None})
            ax.set_xticks(ms, [f"{m:g}x" for m in ms])
            ax.minorticks_off()
            ax.set_title(trace)
            ax.set_xlabel("host budget / live-peak working set")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"vLLM {doc['vllm']} Scheduler, same device blocks and host bytes "
                 f"({doc['geometry']['preset']} scaled)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
