"""What-if: vLLM 0.33 refreshing, in its LRU, the local-hit blocks it skips when a connector
adds external tokens past them; every connector run twice in one process, vLLM as shipped
and then with that one change.

Why: with prefix caching in align mode, a Mamba group needs only the state at the last
computed token, so ``SingleTypeKVCacheManager.add_local_computed_blocks``
(``vllm/v1/core/single_type_kv_cache_manager.py:296-305``) drops every local-hit block below
``(local + external - 1) // block_size`` without touching it. When a connector's hit ends
inside the block after vLLM's own hit (this project's exact end-of-request states), vLLM's
state block at its own hit is never refreshed: it ages in vLLM's free queue although the
conversation is live, while a request that vLLM serves alone touches it. A request whose
prompt ends before the next block boundary leaves no fresher device state behind, so the
conversation's next turn can find vLLM's state evicted. ``--quick``'s multi-round QA at 1x
shows it: 7 requests fall from vLLM's own 192-token hit to 32.

The change tried here (``refreshing``): when external tokens follow a local hit, take
the skipped local-hit blocks and give them back at once (``BlockPool.touch`` then
``free_blocks``), which moves them to the most-recent end of vLLM's free queue and holds
nothing. vLLM's decisions are otherwise unchanged; the same runner checks every byte.

Run: ``.venv/bin/python benchmarks/vllm_lru_refresh.py [--quick] [--traces T,..]
[--multiples M,..] [--peers P,..] [--concurrency N]``. Prints each row's hit rate under
both vLLMs and the difference (the sweeps' progress on stderr); writes
``benchmarks/results/vllm_lru_refresh[_quick][_one_at_a_time].{json,txt}``. A wrong byte
read back stops the run with the runner's error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def refreshing(shipped: Callable[..., None]) -> Callable[..., None]:
    """vLLM's ``add_local_computed_blocks`` (``shipped``) with the change described in the
    module docstring."""

    def add_local_computed_blocks(self: Any, request_id: str, new_computed_blocks: Any,
                                  num_local_computed_tokens: int,
                                  num_external_computed_tokens: int) -> None:
        if self.enable_caching and num_external_computed_tokens > 0:
            total = num_local_computed_tokens + num_external_computed_tokens
            skipped = self.get_num_skipped_tokens(total) // self.block_size
            old = [b for b in new_computed_blocks[:skipped] if not b.is_null]
            if old:  # most recent last, as a request's own blocks are freed
                self.block_pool.touch(old)
                self.block_pool.free_blocks(reversed(old))
        shipped(self, request_id, new_computed_blocks, num_local_computed_tokens,
                num_external_computed_tokens)

    return add_local_computed_blocks


def _refresh_skipped() -> None:
    """Patch vLLM (this process only) with ``refreshing``."""
    from vllm.v1.core import single_type_kv_cache_manager as stm

    cls = stm.SingleTypeKVCacheManager
    cls.add_local_computed_blocks = refreshing(  # type: ignore[method-assign]
        cls.add_local_computed_blocks)


def _rows(cfg: Any, phase: str) -> list[dict[str, Any]]:
    """The sweep's rows; its progress lines go to stderr, headed by ``phase``."""
    from hybrid_connector.bench.vllm_peers import sweep as vp

    print(f"{phase}:", file=sys.stderr, flush=True)
    return list(vp.run_sweep(cfg, progress=True)["rows"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the quick sweep's traces (~3 min)")
    p.add_argument("--traces", help="comma-separated traces (default: the sweep's)")
    p.add_argument("--multiples", help="comma-separated host budgets (default 0.25,1,4)")
    p.add_argument("--peers", default="none,offload-lru,offload-arc,simple,ours-pooled")
    p.add_argument("--concurrency", type=int, help="requests at once (default: the sweep's)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    a = p.parse_args(argv)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from hybrid_connector.bench.vllm_peers import sweep as vp
    from hybrid_connector.bench.vllm_peers.setups import LABELS

    cfg = vp.quick() if a.quick else vp.PeersConfig()
    traces = a.traces.split(",") if a.traces else list(cfg.traces)
    cfg = dataclasses.replace(
        cfg, traces={t: cfg.traces[t] for t in traces}, peers=tuple(a.peers.split(",")),
        multiples=tuple(float(m) for m in (a.multiples or "0.25,1,4").split(",")),
        concurrency=a.concurrency or cfg.concurrency)
    shipped = _rows(cfg, "vLLM as shipped")
    _refresh_skipped()
    changed = _rows(cfg, "vLLM with the skipped local-hit blocks refreshed")
    lines = ["Token hit rate in vLLM 0.33.0's Scheduler as shipped and with the local-hit "
             "blocks it skips refreshed in its LRU (benchmarks/vllm_lru_refresh.py).",
             f"{'trace':16s} {'budget':>6s}  {'connector':30s} {'shipped':>8s} "
             f"{'refreshed':>9s} {'change':>7s}"]
    out = []
    for s, c in zip(shipped, changed, strict=True):
        m = "any" if s["multiple"] is None else f"{s['multiple']:g}x"
        lines.append(f"{s['trace']:16s} {m:>6s}  {LABELS[s['peer']]:30s} {s['hit_rate']:8.3f} "
                     f"{c['hit_rate']:9.3f} {c['hit_rate'] - s['hit_rate']:+7.3f}")
        out.append({"trace": s["trace"], "multiple": s["multiple"], "peer": s["peer"],
                    "shipped": s["hit_rate"], "refreshed": c["hit_rate"],
                    "recomputed_shipped": s["recomputed"],
                    "recomputed_refreshed": c["recomputed"]})
    text = "\n".join(lines) + "\n"
    print(text, end="")
    dest = Path(a.out)
    dest.mkdir(parents=True, exist_ok=True)
    stem = "vllm_lru_refresh" + ("_quick" if a.quick else "") + (
        "_one_at_a_time" if a.concurrency == 1 else "")
    (dest / f"{stem}.txt").write_text(text)
    (dest / f"{stem}.json").write_text(json.dumps({"config": dataclasses.asdict(cfg),
                                                   "rows": out}, indent=1) + "\n")
    print(f"text: {dest / f'{stem}.txt'}\nJSON: {dest / f'{stem}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
