"""The capacity sweep: every configuration at every working set / device budget ratio on
every workload, real tiers, one progress bar; then the peers and the headline comparison.

``run_capacity`` returns the whole result (what the JSON file holds). Nothing is skipped
silently: a tier that cannot run (no room on disk for the NVMe budget) drops its
configurations with a note naming why; the device tier is GPU HBM when CUDA is present
and an equally budgeted CPU slab otherwise, and the notes say which ran.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from hybrid_connector.bench import workload
from hybrid_connector.bench.compute import model_vocab, real_model
from hybrid_connector.bench.objects import ScaledGeometry
from hybrid_connector.bench.peers import run_peers
from hybrid_connector.bench.runner import run_point
from hybrid_connector.bench.schema import CapacityConfig
from hybrid_connector.bench.setups import setup_of, working_set
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.geometry.presets import load_geometry

OURS = "device+host+nvme-ours"


def _geometry(cfg: CapacityConfig) -> tuple[ModelGeometry, Any, dict[str, Any]]:
    """(geometry the objects are sized from, the real model or None, what ran)."""
    if cfg.compute == "real":
        from hybrid_connector.integrations.hf.runtime import geometry_for

        model = real_model(cfg)
        geo = geometry_for(model)
        return geo, model, {"geometry": geo.name, "byte_scale": 1, "real_model": cfg.real.model,
                            "kv_bytes_per_token": geo.kv_bytes_per_token(),
                            "state_bytes": geo.state_bytes()}
    full = load_geometry(cfg.model)
    geo = ScaledGeometry.of(full, cfg.byte_scale)
    return geo, None, {"geometry": full.name, "byte_scale": cfg.byte_scale,
                       "kv_bytes_per_token_full": full.kv_bytes_per_token(),
                       "state_bytes_full": full.state_bytes(),
                       "kv_bytes_per_token": geo.kv_bytes_per_token(), "state_bytes": geo.state_bytes()}


def run_capacity(cfg: CapacityConfig, work: Path | None = None, progress: bool = True) -> dict[str, Any]:
    """The sweep (see module docstring); ``work``: where the NVMe tiers live (a temp dir
    under it, removed at the end; default the system temp dir)."""
    import torch

    from hybrid_connector.tiers.device import default_device

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    t0 = time.perf_counter()
    if cfg.compute == "real":  # transformers resumes at any token (HFRuntime's alignment)
        cfg = cfg.model_copy(update={"alignment": 1})
    geo, model, geo_info = _geometry(cfg)
    dev = default_device()
    notes = [f"device tier: GPU HBM ({dev})" if dev.type == "cuda" else
             "device tier: no GPU here, so an equally budgeted device pool in CPU memory "
             "(hybrid_connector.tiers.device on CPU: the same slab accounting)"]
    if cfg.compute == "modeled":
        notes.append(f"compute: modeled (FLOPs of {geo_info['geometry']} at {cfg.device_tflops:g} "
                     f"TFLOP/s x MFU {cfg.mfu:g}, {cfg.overhead_ms:g} ms per request, loads at "
                     + ", ".join(f"{t} {v:g} GB/s" for t, v in cfg.load_gbps.items())
                     + " of full-size bytes)")
        notes.append(f"object and budget bytes scaled by 1/{cfg.byte_scale} (KV "
                     f"{geo_info['kv_bytes_per_token_full']} -> {geo.kv_bytes_per_token()} B/token, "
                     f"state {geo_info['state_bytes_full'] / 2**20:.1f} MiB -> "
                     f"{geo.state_bytes() / 2**10:.0f} KiB): every ratio and policy decision is "
                     "the full-size model's, only fewer bytes move")
    else:
        notes.append(f"compute: real (transformers {cfg.real.model} tiny Qwen3.5 prefill measured "
                     f"on this machine; objects are its own KV and states, "
                     f"{geo.kv_bytes_per_token()} B/token, state {geo.state_bytes()} B)")
    base = Path(work) if work is not None else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="hc-capacity-", dir=base))
    vocab = model_vocab(model) if model is not None else 32000
    specs = cfg.workloads
    if model is not None:
        specs = tuple(w.model_copy(update={"sessions": min(w.sessions, cfg.real.sessions),
                                           "tokens_scale": w.tokens_scale * cfg.real.tokens_scale})
                      for w in specs)
        notes.append(f"real compute: workloads shrunk to at most {cfg.real.sessions} sessions, "
                     f"every length x {cfg.real.tokens_scale:g}, token ids below the model's "
                     f"vocabulary ({vocab})")
    loads = {w.name: workload.build(w, vocab) for w in specs}
    configs: list[str] = list(cfg.configurations)
    plan: list[tuple[str, float, str, dict[str, int], float]] = []
    sets: dict[str, Any] = {}
    for w in specs:
        recs = loads[w.name]
        ours = working_set(cfg, setup_of(OURS, cfg, geo), geo, recs)
        vb = working_set(cfg, setup_of("vllm-block", cfg, geo), geo, recs) if "vllm-block" in configs else ours
        sets[w.name] = {"summary": workload.summary(recs), "working_set_bytes": ours.total,
                        "working_set_kv": ours.kv, "working_set_state": ours.state,
                        "stored_bytes_unlimited": ours.stored, "hit_rate_unlimited": ours.hit_rate,
                        "vllm_block_working_set": vb.total, "budgets": {}}
        nvme = int(ours.stored * cfg.disk_per_stored)
        for ratio in cfg.ratios:
            device = max(1, int(ours.total / ratio))
            budgets = {"device": device, "host": int(device * cfg.host_per_device), "nvme": nvme}
            sets[w.name]["budgets"][str(ratio)] = budgets
            for c in configs:
                plan.append((w.name, ratio, c, budgets, (vb if c == "vllm-block" else ours).kv_share))
    need = max((p[3]["nvme"] for p in plan if "nvme" in p[2]), default=0)
    free = shutil.disk_usage(tmp).free
    if need and free < 2 * need:
        notes.append(f"NVMe tier NOT run: {free / 1e9:.1f} GB free under {base} for a "
                     f"{need / 1e9:.2f} GB budget; its configurations are left out")
        plan = [p for p in plan if "nvme" not in p[2]]
    elif need:
        notes.append(f"NVMe tier: files under {tmp} (fsync {cfg.disk_fsync}, removed at the end)")
    try:
        rows = _sweep(cfg, plan, loads, geo, tmp, model, progress)
        peers: dict[str, Any] = {"ran": False, "why": "peers: false in the config"}
        if cfg.peers:
            # full-size objects of the geometry (what an engine stores), a few of each kind
            scale = int(geo_info["byte_scale"])
            sizes = {ObjectKind.KV: (geo.kv_bytes_per_token() * scale * cfg.chunk_size, 8),
                     ObjectKind.STATE: (geo.state_bytes() * scale, 2)}
            peers = run_peers(sizes, tmp, cfg.peer_reps, cfg.disk_fsync)
            peers["ran"] = peers.get("lmcache") is not None
            if not peers["ran"]:
                notes.append(f"peers NOT run: LMCache's backends cannot be loaded here: "
                             f"{peers['unavailable']}")
    finally:  # also after a failure: no NVMe files are left behind
        shutil.rmtree(tmp, ignore_errors=True)
    doc = {"config": cfg.model_dump(mode="json"), "compute": cfg.compute, "geometry": geo_info,
           "device": str(dev), "workloads": sets, "rows": rows, "peers": peers, "notes": notes,
           "wall_s": time.perf_counter() - t0}
    doc["headline"] = headline(cfg, rows)
    return doc


def _sweep(cfg: CapacityConfig, plan: list[tuple[str, float, str, dict[str, int], float]],
           loads: dict[str, list[dict[str, Any]]], geo: ModelGeometry, tmp: Path, model: Any,
           progress: bool) -> list[dict[str, Any]]:
    """Every planned point, in order, under one progress bar."""
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=sum(len(loads[p[0]]) for p in plan), desc="capacity", unit="req",
               disable=not progress, dynamic_ncols=True)
    try:
        for wname, ratio, c, budgets, mix in plan:
            bar.set_postfix_str(f"{wname} {ratio:g}x {c}")
            res = run_point(cfg, setup_of(c, cfg, geo), geo, wname, loads[wname], ratio,
                            budgets, mix, tmp, model=model, tick=lambda: bar.update(1))
            rows.append(res.row())
    finally:
        bar.close()
    return rows


def _row(rows: list[dict[str, Any]], w: str, ratio: float, c: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["workload"] == w and r["ratio"] == ratio and r["config"] == c), None)


def headline(cfg: CapacityConfig, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Ours (device+host+NVMe) against device-only LRU at the headline workload and ratio."""
    w, ratio = cfg.headline, cfg.headline_ratio
    ours, lru = _row(rows, w, ratio, OURS), _row(rows, w, ratio, "device-lru")
    if ours is None or lru is None:
        return {"compared": False, "why": f"{OURS} or device-lru did not run at {ratio}x on {w}"}
    x = ours["throughput_rps"] / lru["throughput_rps"] if lru["throughput_rps"] else 0.0
    return {"compared": True, "workload": w, "ratio": ratio,
            "ours_token_hit_rate": ours["token_hit_rate"],
            "device_lru_token_hit_rate": lru["token_hit_rate"], "throughput_x": x}


def _ms(r: dict[str, Any]) -> str:
    n = max(1, r["requests"])
    return (f"{r['ttft_mean_s'] * 1e3:.1f} ms = overhead {r['overhead_s'] / n * 1e3:.1f} + "
            f"recompute {r['compute_s'] / n * 1e3:.1f} + loads {r['load_s'] / n * 1e3:.1f}")


def summary(doc: dict[str, Any]) -> str:
    """What a user reads after the tables: the peers' ratios and, at the headline point, ours
    against device-only LRU (token hit rate, throughput, where the time goes), next to the
    most any budget can reach on that workload."""
    h = doc["headline"]
    lines = [*(f"note: {n}" for n in doc["notes"])]
    p = doc["peers"]
    if p.get("ran"):
        ratios = "; ".join(f"{k} put {v['put']:.2f} get {v['get']:.2f}" for k, v in p["ratios"].items())
        lines.append(f"peers (LMCache {p['lmcache']}, same objects, LMCache's time / ours, "
                     f"> 1 = ours faster): {ratios}")
    if not h.get("compared"):
        lines.append(f"no headline comparison: {h['why']}")
        return "\n".join(lines)
    ws = doc["workloads"][h["workload"]]
    ours = _row(doc["rows"], h["workload"], h["ratio"], OURS)
    lru = _row(doc["rows"], h["workload"], h["ratio"], "device-lru")
    assert ours is not None and lru is not None
    gain = h["ours_token_hit_rate"] / h["device_lru_token_hit_rate"] if h["device_lru_token_hit_rate"] else float("inf")
    lines.append(
        f"at {h['ratio']:g}x working set / device budget on {h['workload']}: token hit rate "
        f"{h['ours_token_hit_rate']:.3f} with device+host+NVMe (ours) vs "
        f"{h['device_lru_token_hit_rate']:.3f} device-only LRU ({gain:.2f}x); throughput "
        f"{h['throughput_x']:.2f}x device-only LRU; unlimited room would reach "
        f"{ws['hit_rate_unlimited']:.3f} on this workload")
    lines.append(f"  mean TTFT ours {_ms(ours)}; device-only LRU {_ms(lru)}")
    return "\n".join(lines)
