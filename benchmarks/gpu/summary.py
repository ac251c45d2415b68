"""Write run_all.sh's one JSON summary (stdlib only; run after every step, so a run cut
short still leaves one).

    python3 benchmarks/gpu/summary.py LOGDIR MODE BUDGET_S [--final]

Reads ``LOGDIR/steps.tsv`` (one ``name rc seconds timeout_s`` line per finished step) and
each step's own ``LOGDIR/NAME.json`` when it wrote one; writes ``LOGDIR/summary.json``:
the steps (rc, seconds, timed out), the failed ones, every step's figures, and a headline
of the longest prompt's TTFTs (full prefill vs each tier's hit, hidden share, kernels vs a
device copy). ``complete`` is true only with ``--final``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def headline(hf: dict[str, Any]) -> dict[str, Any]:
    """The longest prompt's figures of a bench_hf_ttft JSON."""
    if not hf.get("cases"):
        return {}
    case = max(hf["cases"], key=lambda c: c["prompt_tokens"])
    out: dict[str, Any] = {"preset": hf.get("preset"), "prompt_tokens": case["prompt_tokens"],
                           "full_ttft_ms": round(case["full_ttft_s"] * 1e3, 2)}
    for tier, r in case.get("tiers", {}).items():
        out[tier] = {
            "sync_ttft_ms": round(r["sync_ttft_s"] * 1e3, 2),
            "layerwise_ttft_ms": round(r["layerwise_ttft_s"] * 1e3, 2),
            "speedup_sync": round(r["ratio_sync"], 2),
            "speedup_layerwise": round(r["ratio_layerwise"], 2),
            "load_GBps": round(r["load_GBps"], 2),
            "hidden_share": round(r["hidden_share"], 3),
            "kernel_vs_copy": round(r["kernel_vs_copy"], 3),
        }
    if "replay" in case:
        r = case["replay"]
        out["replay"] = {"ttft_ms": round(r["replay_ttft_s"] * 1e3, 2),
                         "speedup": round(r["ratio"], 2), "top1_equal": r["top1_equal"]}
    return out


def main(argv: list[str]) -> int:
    logdir, mode, budget = Path(argv[0]), argv[1], float(argv[2])
    final = "--final" in argv[3:]
    steps: list[dict[str, Any]] = []
    tsv = logdir / "steps.tsv"
    for line in tsv.read_text().splitlines() if tsv.exists() else []:
        name, rc, secs, limit = line.split("\t")
        steps.append({"name": name, "rc": int(rc), "seconds": int(secs), "timeout_s": int(limit),
                      "timed_out": int(rc) in (124, 137), "log": f"{name}.log"})
    results: dict[str, Any] = {}
    for s in steps:
        p = logdir / f"{s['name']}.json"
        if p.exists():
            try:
                results[s["name"]] = json.loads(p.read_text())
            except ValueError as exc:
                results[s["name"]] = {"unreadable": repr(exc)}
    summary = {
        "mode": mode, "budget_s": budget, "complete": final,
        "seconds": sum(s["seconds"] for s in steps),
        "failed": [s["name"] for s in steps if s["rc"] != 0],
        "steps": steps,
        "headline": {k: headline(v) for k, v in results.items() if k.startswith("hf_ttft")},
        "results": results,
    }
    tmp = logdir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(logdir / "summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
