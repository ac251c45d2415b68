"""The report's lines for the host + disk peers (``disk_peers``): per trace and host budget
their disk budget and bytes, and ours with its NVMe tier against vLLM's fs tier."""

from __future__ import annotations

from typing import Any

from hybrid_connector.bench.vllm_peers.setups import DISK_PEERS, LABELS

TIE = 0.0005  # token hit rates closer than this are a tie


def compare(ours: dict[str, Any], other: dict[str, Any]) -> tuple[str, float, float]:
    """Row ``ours`` against row ``other``: who wins on token hit rate ("ours", "tie" or
    "other", within ``TIE``), the hit-rate difference and the ratio of tokens recomputed
    (nan when ``other`` recomputed none). The one rule every verdict of the report uses."""
    d = ours["hit_rate"] - other["hit_rate"]
    who = "ours" if d > TIE else "tie" if abs(d) <= TIE else "other"
    rec = ours["recomputed"] / other["recomputed"] if other["recomputed"] else float("nan")
    return who, d, rec


def _mb(x: float | None) -> str:
    return f"{'-' if x is None else format(x / 1e6, '.2f'):>8s}"


def lines(doc: dict[str, Any]) -> list[str]:
    """The disk table and verdicts; empty when no disk peer ran."""
    rows = [r for r in doc["rows"] if r["peer"] in DISK_PEERS]
    if not rows:
        return []
    out = ["Disk tiers (MB of the scaled model): budget = the disk bytes the peer was given "
           "(vLLM's fs tier has no capacity: what it held); peak = most held by the disk "
           "tier's own accounting; files = the directory on disk at the end; from disk = bytes "
           "a disk tier served into vLLM's blocks (modeled at the nvme rate on top of the "
           "host-to-GPU copy).",
           f"  {'trace':15s} {'budget':>6s} {'connector':30s} {'budget':>8s} {'peak':>8s} "
           f"{'files':>8s} {'from disk':>9s} {'hit':>6s} {'TTFT ms':>8s}"]
    key = sorted(rows, key=lambda r: (r["trace"], r["multiple"], DISK_PEERS.index(r["peer"])))
    for r in key:
        budget = r.get("disk_budget", r.get("disk_peak_bytes"))
        out.append(f"  {r['trace']:15s} {r['multiple']:>5g}x {LABELS[r['peer']]:30s} "
                   f"{_mb(budget)} {_mb(r.get('disk_peak_bytes'))} {_mb(r.get('disk_file_bytes'))} "
                   f"{_mb(r.get('disk_loaded_bytes')):>9s} {r['hit_rate']:6.3f} "
                   f"{r['ttft']['mean_ms'] if 'ttft' in r else float('nan'):8.1f}")
    out += ["", "Ours with its NVMe tier against vLLM's OffloadingConnector with its fs tier "
                "(same host bytes, disk budget as above):"]
    for r in key:
        if r["peer"] != "ours-nvme":
            continue
        fs = next((x for x in rows if x["peer"] == "offload-fs" and x["trace"] == r["trace"]
                   and x["multiple"] == r["multiple"]), None)
        if fs is None:
            continue
        win, d, rec = compare(r, fs)
        who = {"ours": "ours wins", "tie": "tie", "other": "vLLM's fs wins"}[win]
        tt = (r["ttft"]["mean_ms"] / fs["ttft"]["mean_ms"]
              if "ttft" in r and "ttft" in fs and fs["ttft"]["mean_ms"] else float("nan"))
        out.append(f"  {r['trace']:15s} {r['multiple']:>4g}x: {who:14s} hit rate "
                   f"{r['hit_rate']:.3f} vs {fs['hit_rate']:.3f} ({d:+.3f}); recomputed "
                   f"x{rec:.2f}; modeled TTFT x{tt:.2f}")
    return out
