"""Eviction behind SGLang's hash-only L3 calls: LRU (the default) vs the FLOP-aware order
(``tier_eviction: value`` over the page chain SGLang's ``prefix_keys`` give,
``hybrid_connector/integrations/sglang/chain.py``).

Run: ``.venv/bin/python benchmarks/sglang_eviction.py [--quick]`` (needs sglang 0.5.23,
installed by ``scripts/test.sh``).

The driver makes the calls SGLang 0.5.23's hybrid HiCache controller makes on its L3
backend, through the real ``HybridHiCacheStorage`` built by SGLang's own ``dynamic``
factory, page hashes from SGLang's ``get_hash_str`` (page 64), ``prefix_keys`` passed as
with ``"hicache_storage_pass_prefix_keys": true``. Per request of a synthetic trace:
``batch_exists_v2`` over its full pages with a MAMBA trailing-pages transfer (the hit:
the longest prefix whose KV pages and the state at its last page are held),
``batch_get_v2`` of the hit (KV pages + state), then the backups: the KV pages after the
hit and a state at the prompt's last full page, and after decoding the output's pages
and a state at their end (what the next turn of the session continues from). Only the L3
store is modeled (SGLang's device and host caches in front of it are left out: every
request asks L3 from its first page), one host tier with per-kind pools of working set /
ratio each (KV and states as SGLang pages and MAMBA slots of Qwen3.5-4B, bytes / 1024).

Prints per workload and ratio the token hit rate and the fraction of prefill FLOPs
saved (Qwen3.5-4B's FLOPs of the hit prefix over the prompt's) for both orders, and
value / LRU ratios; writes ``benchmarks/results/sglang_eviction[_quick].{json,md,png}``.
"""

# ruff: noqa: E402  (imports follow the sys.path set-up)
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_hash_str
from tqdm import tqdm

from hybrid_connector.geometry.presets import load_geometry
from hybrid_connector.sim.traces import agentic, multi_turn_chat

PAGE, SCALE, PRESET = 64, 1024, "qwen3.5-4b"


def pages_of(tokens: list[int]) -> list[str]:
    """SGLang's chained hashes of the full pages of ``tokens`` (SGLang stores and looks up
    full pages only; ``get_hash_str`` would also hash a trailing partial page)."""
    return get_hash_str(tokens[: len(tokens) // PAGE * PAGE], None, page_size=PAGE)
DYNAMIC = {"backend_name": "hybrid", "module_path": "hybrid_connector.integrations.sglang",
           "class_name": "HybridHiCacheStorage"}


class FlatPool:
    """The host-pool calls a storage backend makes (``get_data_page``,
    ``get_dummy_flat_data_page``, ``set_from_flat_data_page``): ``slots`` pages of
    ``page_bytes`` each, addressed by token index (``page_size`` tokens per page)."""

    def __init__(self, page_bytes: int, slots: int, page_size: int) -> None:
        self.page_size, self.layout = page_size, "page_first"
        self.size = slots * page_size  # token slots: what host indices are checked against
        self.buf = torch.zeros(slots, page_bytes, dtype=torch.uint8)

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        return self.buf[index // self.page_size]

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros_like(self.buf[0])

    def set_from_flat_data_page(self, index: int, data: torch.Tensor) -> None:
        self.buf[index // self.page_size].copy_(data)


def backend(mode: str, kv_bytes: int, state_bytes: int, kv_page: int, slot: int,
            max_pages: int, window: int = 16) -> Any:
    over: dict[str, Any] = {"pools": {"host": {"kv": kv_bytes, "state": state_bytes}},
                            "max_local_cpu_size": f"{kv_bytes + state_bytes + (1 << 20)}B"}
    if mode == "value":
        over |= {"tier_eviction": "value", "model": PRESET, "tier_value_window": window}
    sc = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=PRESET, extra_config={**DYNAMIC, "overrides": over})
    b = StorageBackendFactory.create_backend("dynamic", sc, None)
    kv = FlatPool(kv_page, max_pages, PAGE)
    b.register_mem_pool_host(kv)
    b.register_mem_host_pool_v2(kv, PoolName.KV)
    b.register_mem_host_pool_v2(FlatPool(slot, 1, 1), PoolName.MAMBA)
    return b


def kv_t(hashes: list[str], first: int) -> PoolTransfer:
    idx = torch.arange(first * PAGE, (first + len(hashes)) * PAGE, dtype=torch.int64)
    return PoolTransfer(name=PoolName.KV, host_indices=idx, keys=list(hashes))


def state_t(last: str, slot: int | None = 0) -> PoolTransfer:
    idx = None if slot is None else torch.tensor([slot], dtype=torch.int64)
    return PoolTransfer(name=PoolName.MAMBA, host_indices=idx, keys=[last],
                        hit_policy=PoolHitPolicy.TRAILING_PAGES)


def backup(b: Any, hashes: list[str], first: int) -> None:
    """SGLang's backup of pages ``first:`` of a chain and of the state at its end."""
    if first < len(hashes):
        info = HiCacheStorageExtraInfo(prefix_keys=hashes[:first])
        b.batch_set_v2([kv_t(hashes[first:], 0)], info)
    if hashes:
        b.batch_set_v2([state_t(hashes[-1])], HiCacheStorageExtraInfo(prefix_keys=hashes[:-1]))


def run(mode: str, records: list[dict[str, Any]], ratio: float, sizes: dict[str, int],
        label: str, window: int = 16) -> dict[str, float]:
    geo = load_geometry(PRESET)
    kv_page, slot = sizes["kv_page"], sizes["slot"]
    b = backend(mode, int(sizes["kv_ws"] / ratio), int(sizes["state_ws"] / ratio), kv_page,
                   slot, sizes["max_pages"], window)
    hit_tok = all_tok = 0
    saved = total = 0.0
    for r in tqdm(records, desc=f"{label} {mode}", leave=False, unit="req"):
        toks = list(r["input_tokens"])
        hashes = pages_of(toks)
        ex = b.batch_exists_v2(hashes, [state_t(hashes[-1], None)],
                               HiCacheStorageExtraInfo(prefix_keys=[])) if hashes else None
        hit = ex.kv_hit_pages if ex is not None else 0
        if hit:
            got = b.batch_get_v2([kv_t(hashes[:hit], 0), state_t(hashes[hit - 1])],
                                 HiCacheStorageExtraInfo(prefix_keys=[]))
            if not (all(got["kv"]) and all(got["mamba"])):
                hit = 0  # a page went between exists and get: SGLang recomputes
        hit_tok += hit * PAGE
        all_tok += len(toks)
        saved += geo.flops_saved(hit * PAGE, 0).total
        total += geo.flops_saved(len(toks), 0).total
        backup(b, hashes, hit)
        full = pages_of(toks + list(r["output_tokens"]))
        backup(b, full, len(hashes))
    b.chain.check_integrity()
    b.close()
    return {"token_hit_rate": hit_tok / all_tok, "flops_saved": saved / total}


def working_set(records: list[dict[str, Any]], kv_page: int, slot: int) -> dict[str, int]:
    """Bytes of every distinct KV page and state the run will back up (the L3 footprint
    with unlimited room), and the most pages one request names."""
    pages: set[str] = set()
    states: set[str] = set()
    most = 0
    for r in records:
        for toks in (list(r["input_tokens"]), list(r["input_tokens"]) + list(r["output_tokens"])):
            h = pages_of(toks)
            pages.update(h)
            if h:
                states.add(h[-1])
            most = max(most, len(h))
    return {"kv_ws": len(pages) * kv_page, "state_ws": len(states) * slot, "kv_page": kv_page,
            "slot": slot, "max_pages": most + 1}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short traces, one ratio (~1 min)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    geo = load_geometry(PRESET)
    kv_page = geo.kv_bytes_per_token() * PAGE // SCALE
    slot = geo.state_bytes() // SCALE
    n = 6 if args.quick else 24
    traces = {
        "agentic": agentic(num_sessions=n, turns=8 if args.quick else 14, seed=args.seed,
                           max_input=16384),
        "chat": multi_turn_chat(num_sessions=n * 3, turns=6, seed=args.seed),
    }
    ratios = (4.0,) if args.quick else (2.0, 4.0, 8.0)
    rows: list[dict[str, Any]] = []
    print(f"SGLang L3 eviction, {PRESET} pages of {PAGE} tokens (bytes / {SCALE}: KV page "
          f"{kv_page} B, state {slot} B); working set / ratio per pool")
    for name, recs in traces.items():
        sizes = working_set(recs, kv_page, slot)
        for ratio in ratios:
            res = {m: run(m, recs, ratio, sizes, f"{name} {ratio:g}x") for m in ("lru", "value")}
            row = {"workload": name, "ratio": ratio, "requests": len(recs), **{
                f"{m}_{k}": v for m, d in res.items() for k, v in d.items()}}
            row["hit_ratio"] = row["value_token_hit_rate"] / max(row["lru_token_hit_rate"], 1e-9)
            row["flops_ratio"] = row["value_flops_saved"] / max(row["lru_flops_saved"], 1e-9)
            rows.append(row)
            print(f"  {name:8} {ratio:>3g}x  token hit lru {row['lru_token_hit_rate']:.3f} "
                  f"value {row['value_token_hit_rate']:.3f} (x{row['hit_ratio']:.2f})  "
                  f"FLOPs saved lru {row['lru_flops_saved']:.3f} value "
                  f"{row['value_flops_saved']:.3f} (x{row['flops_ratio']:.2f})")
    stem = Path(_HERE) / "results" / f"sglang_eviction{'_quick' if args.quick else ''}"
    stem.with_suffix(".json").write_text(json.dumps({"preset": PRESET, "page": PAGE,
                                                     "byte_scale": SCALE, "rows": rows}, indent=2))
    md = ["| workload | ratio | requests | token hit LRU | token hit value | x | FLOPs saved LRU "
          "| FLOPs saved value | x |", "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['workload']} | {r['ratio']:g}x | {r['requests']} | {r['lru_token_hit_rate']:.3f}"
           f" | {r['value_token_hit_rate']:.3f} | {r['hit_ratio']:.2f} | {r['lru_flops_saved']:.3f}"
           f" | {r['value_flops_saved']:.3f} | {r['flops_ratio']:.2f} |" for r in rows]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    plot(rows, stem.with_suffix(".png"))
    print(f"wrote {stem}.{{json,md,png}}")
    return 0


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = [f"{r['workload']}\n{r['ratio']:g}x" for r in rows]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["lru_flops_saved"] for r in rows], 0.4, label="LRU")
    ax.bar([i + 0.2 for i in x], [r["value_flops_saved"] for r in rows], 0.4,
           label="FLOP-aware (value)")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("prefill FLOPs saved")
    ax.set_title("SGLang L3 behind hash-only calls: working set / ratio per pool")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
