"""Eviction across tiers (``tier_eviction: lru`` vs ``value``) through the real cache.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/tier_eviction.py [--quick]``

The capacity benchmark's machinery (``hybrid_connector.bench``): its workloads (agentic,
chat), its working-set sizing (device budget = working set / ratio, host = 2x device,
NVMe = 1.5x everything stored with unlimited room), the real ``HybridCache`` over real
tiers (device slab, host slab, NVMe files) with our policies (Marconi admission and
eviction, alpha tuned), and its modeled TTFT (FLOPs of Qwen3.5-4B at 989 TFLOP/s x MFU
0.45 + 10 ms per request + every loaded object's full-size bytes over its tier's bandwidth:
device 1500, host 25, NVMe 6 GB/s). Each point runs twice, the switch off (today's LRU
demotion inside the tiers) and on (value per byte, ``policies.tier_value``, with the same
bandwidths and compute rate, scaled to the benchmark's 1/byte_scale bytes).

Writes ``benchmarks/results/tier_eviction[_quick].{json,md,png}``: per point the token hit
rate, loaded bytes per tier (full size), mean modeled TTFT, and the on/off ratios.
``--quick``: 4 sessions per workload, one ratio (< 1 min).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hybrid_connector.bench import workload  # noqa: E402
from hybrid_connector.bench.capacity import OURS, _geometry  # noqa: E402
from hybrid_connector.bench.runner import run_point  # noqa: E402
from hybrid_connector.bench.schema import CapacityConfig, load_capacity_config  # noqa: E402
from hybrid_connector.bench.setups import Setup, setup_of, working_set  # noqa: E402

CONFIGS = ("device+host-ours", "device+host+nvme-ours")
# Marconi's alpha fixed (the capacity benchmark tunes it in a background thread, whose
# timing moves the tree's choices between runs by more than the effect measured here)
ALPHA = 1.0
TIERS = ("device", "host", "nvme")


def switched(cfg: CapacityConfig, setup: Setup, mode: str, window: int | None = None) -> Setup:
    """``setup`` with ``tier_eviction: mode`` (value: the benchmark's rates, bytes scaled)."""
    over: dict[str, Any] = {"tier_eviction": mode, "alpha": ALPHA}
    if mode == "value":
        s = cfg.byte_scale
        bw = cfg.load_gbps
        over["tier_read_gbps"] = {"device": bw["device"] / s, "host": bw["host"] / s,
                                  "disk": bw["nvme"] / s}
        over["recompute_tflops"] = cfg.device_tflops * cfg.mfu
        if window is not None:
            over["tier_value_window"] = window
    return Setup(f"{setup.name}.{mode}", setup.tiers, {**setup.policy, **over})


def ledger_cost(window: int, n: int = 20000, cap: int = 2000) -> float:
    """Microseconds per ``Ledger.place`` of a KV chunk once device, host and NVMe pools
    (``cap`` objects each) are full, so that every place evicts through all three (the
    worst case), with a touch every third place; ``window`` 0: LRU."""
    from hybrid_connector.core.keys import ObjectKey, ObjectKind
    from hybrid_connector.geometry.presets import load_geometry
    from hybrid_connector.policies.eviction.tier_value import TierValue
    from hybrid_connector.tiers.ledger.ledger import Ledger, TierSpec

    tv = TierValue(load_geometry("qwen3.5-4b"), {"device": 1500e9, "host": 25e9, "nvme": 6e9},
                   445e12)
    led = Ledger([TierSpec.per_kind(t, {ObjectKind.KV: cap * 100}) for t in TIERS],
                 value=tv, value_window=window)
    keys = [ObjectKey("fp", i.to_bytes(16, "little"), ObjectKind.KV, (i % 64) * 256,
                      (i % 64) * 256 + 256) for i in range(n)]
    t = time.perf_counter()
    for i, k in enumerate(keys):
        led.place(k, 100)
        led.commit(k, True)
        if i % 3 == 0:
            led.touch([keys[i // 2]])
    return (time.perf_counter() - t) / n * 1e6


def summarise(row: dict[str, Any], scale: int) -> dict[str, Any]:
    loaded = {t: sum(row["loaded_bytes"].get(t, {}).values()) * scale for t in TIERS}
    return {"token_hit_rate": row["token_hit_rate"], "ttft_mean_ms": row["ttft_mean_s"] * 1e3,
            "ttft_p95_ms": row["ttft_p95_s"] * 1e3, "load_ms": row["load_s"] / row["requests"] * 1e3,
            "recompute_ms": row["compute_s"] / row["requests"] * 1e3,
            "loaded_gb": {t: v / 1e9 for t, v in loaded.items()},
            "demotions": row["movement"].get("demotions", {}),
            "drops": row["movement"].get("drops", {}), "wall_s": row["wall_s"]}


def run(quick: bool, window: int | None = None) -> dict[str, Any]:
    cfg = load_capacity_config()
    ratios = (4.0,) if quick else (2.0, 4.0, 8.0)
    specs = tuple(w.model_copy(update={"sessions": 4}) if quick else w for w in cfg.workloads)
    geo, _, info = _geometry(cfg)
    t0 = time.perf_counter()
    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hc-tier-eviction-") as tmp:
        for w in specs:
            recs = workload.build(w)
            ws = working_set(cfg, setup_of(OURS, cfg, geo), geo, recs)
            nvme = int(ws.stored * cfg.disk_per_stored)
            for ratio in ratios:
                device = max(1, int(ws.total / ratio))
                budgets = {"device": device, "host": int(device * cfg.host_per_device), "nvme": nvme}
                for c in CONFIGS:
                    base = setup_of(c, cfg, geo)
                    out: dict[str, Any] = {"workload": w.name, "ratio": ratio, "config": c}
                    for mode in ("lru", "value"):
                        row = run_point(cfg, switched(cfg, base, mode, window), geo, w.name, recs, ratio,
                                        budgets, ws.kv_share, Path(tmp)).row()
                        out[mode] = summarise(row, cfg.byte_scale)
                    off, on = out["lru"], out["value"]
                    out["ratios"] = {
                        "token_hit_rate": on["token_hit_rate"] / max(off["token_hit_rate"], 1e-12),
                        "ttft_mean": on["ttft_mean_ms"] / off["ttft_mean_ms"],
                        "loaded_gb": {t: (on["loaded_gb"][t] / off["loaded_gb"][t]
                                          if off["loaded_gb"][t] else None) for t in TIERS}}
                    points.append(out)
                    print(line(out), flush=True)
    from hybrid_connector.core.config import HybridConfig

    w = window if window is not None else HybridConfig.model_fields["tier_value_window"].default
    cost = {"lru_us": ledger_cost(0), "value_us": ledger_cost(w), "window": w}
    print(f"ledger place through 3 full tiers: LRU {cost['lru_us']:.0f} us, value (window "
          f"{w}) {cost['value_us']:.0f} us", flush=True)
    summary = {c: geomean([p["ratios"]["ttft_mean"] for p in points if p["config"] == c])
               for c in CONFIGS}
    return {"quick": quick, "window": w, "geometry": info, "ttft_ratio_geomean": summary,
            "ledger_cost": cost, "ratios": list(ratios),
            "workloads": [w.name for w in specs], "configs": list(CONFIGS),
            "rates": {"load_gbps": cfg.load_gbps, "tflops": cfg.device_tflops, "mfu": cfg.mfu,
                      "overhead_ms": cfg.overhead_ms},
            "points": points, "wall_s": time.perf_counter() - t0}


def geomean(xs: list[float]) -> float:
    return float(math.exp(sum(math.log(x) for x in xs) / len(xs))) if xs else 1.0


def line(p: dict[str, Any]) -> str:
    off, on, r = p["lru"], p["value"], p["ratios"]
    gb = " ".join(f"{t} {off['loaded_gb'][t]:.2f}->{on['loaded_gb'][t]:.2f}" for t in TIERS)
    return (f"{p['workload']:8s} {p['ratio']:g}x {p['config']:22s} hit {off['token_hit_rate']:.3f}"
            f"->{on['token_hit_rate']:.3f} TTFT {off['ttft_mean_ms']:.1f}->{on['ttft_mean_ms']:.1f} ms "
            f"(x{r['ttft_mean']:.3f}) loaded GB {gb}")


def markdown(doc: dict[str, Any]) -> str:
    rows = ["| workload | ratio | tiers | token hit off / on | TTFT ms off / on (on/off) | "
            "loads ms off / on | loaded GB device | host | NVMe |",
            "|---|---|---|---|---|---|---|---|---|"]
    for p in doc["points"]:
        off, on, r = p["lru"], p["value"], p["ratios"]
        gb = " | ".join(f"{off['loaded_gb'][t]:.2f} / {on['loaded_gb'][t]:.2f}" for t in TIERS)
        rows.append(f"| {p['workload']} | {p['ratio']:g}x | {p['config'].removesuffix('-ours')} | "
                    f"{off['token_hit_rate']:.3f} / {on['token_hit_rate']:.3f} | "
                    f"{off['ttft_mean_ms']:.1f} / {on['ttft_mean_ms']:.1f} ({r['ttft_mean']:.3f}) | "
                    f"{off['load_ms']:.1f} / {on['load_ms']:.1f} | {gb} |")
    rt = doc["rates"]
    head = (f"# Eviction across tiers: `tier_eviction` lru (off) vs value (on)\n\n"
            f"`benchmarks/tier_eviction.py{' --quick' if doc['quick'] else ''}`, "
            f"{doc['wall_s']:.0f} s. Real `HybridCache` over real tiers, our policies (Marconi), "
            f"geometry {doc['geometry']['geometry']}, modeled TTFT: {rt['tflops']:g} TFLOP/s x MFU "
            f"{rt['mfu']:g}, {rt['overhead_ms']:g} ms per request, loads at "
            + ", ".join(f"{t} {v:g} GB/s" for t, v in rt["load_gbps"].items())
            + ". Ratio: working set / device budget (host 2x device, NVMe 1.5x all stored). "
            "Loaded GB are full-size bytes over the whole trace.\n\n")
    means = "; ".join(f"{c.removesuffix('-ours')} x{v:.3f}" for c, v in doc["ttft_ratio_geomean"].items())
    c = doc["ledger_cost"]
    return (head + "\n".join(rows) + f"\n\nGeometric mean of the TTFT ratio on/off: {means}.\n\n"
            f"Ledger cost (`ledger_cost`: a place that evicts through three full tiers, the "
            f"worst case): LRU {c['lru_us']:.0f} us, value with window {c['window']} "
            f"{c['value_us']:.0f} us.\n")


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(doc["workloads"]), figsize=(5 * len(doc["workloads"]), 3.6),
                             squeeze=False)
    for ax, w in zip(axes[0], doc["workloads"], strict=True):
        for c, color in zip(doc["configs"], ("tab:blue", "tab:red"), strict=False):
            ps = [p for p in doc["points"] if p["workload"] == w and p["config"] == c]
            x = [p["ratio"] for p in ps]
            for mode, style in (("lru", "--"), ("value", "-")):
                ax.plot(x, [p[mode]["ttft_mean_ms"] for p in ps], style, marker="o", color=color,
                        label=f"{c.removesuffix('-ours')} {mode}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("working set / device budget")
        ax.set_ylabel("mean modeled TTFT (ms)")
        ax.set_title(w)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--window", type=int, default=None,
                    help="tier_value_window (default: the config's, 16)")
    args = ap.parse_args()
    doc = run(args.quick, args.window)
    stem = args.out / ("tier_eviction_quick" if args.quick else "tier_eviction")
    args.out.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    stem.with_suffix(".md").write_text(markdown(doc))
    plot(doc, stem.with_suffix(".png"))
    print("TTFT on/off, geometric mean: " + ", ".join(
        f"{c} x{v:.3f}" for c, v in doc["ttft_ratio_geomean"].items()))
    print(f"wrote {stem}.{{json,md,png}} in {doc['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
