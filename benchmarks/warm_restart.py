"""Warm restart of the whole cache: how long a new cache takes to come up over an NVMe
directory holding N objects, and whether its first request hits.

Objects are saved by a real cache (keys, metadata and chains exactly as a run makes them):
requests of 2,048 tokens sharing 512-token prefixes, each giving 8 KV chunks of 256 tokens
and its checkpoints, through ``RequestSession``. Small payloads (a tiny geometry: 4 KiB per
chunk) keep disk use modest; the restart cost is per object, not per byte. Then, best of
``--reps`` cold starts: the NVMe tier alone (``NvmeTier``: listing, one header read per
file, metadata decoding) against the whole cache (``assemble.cache``: the tier, the
ledger adopting every object, the index re-linking the radix tree from the metadata),
measured in the same run, and the first request of a prompt the previous run served.

    python benchmarks/warm_restart.py [--quick] [--objects N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]  # tiers.py shadows tiers
sys.path.insert(0, os.path.dirname(_HERE))

from hybrid_connector import assemble  # noqa: E402
from hybrid_connector.core.config import load_config  # noqa: E402
from hybrid_connector.core.keys import ObjectKind  # noqa: E402
from hybrid_connector.geometry.model import ModelGeometry  # noqa: E402
from hybrid_connector.runtime.session import RequestSession  # noqa: E402
from hybrid_connector.tiers.manager import TieredStore  # noqa: E402
from hybrid_connector.tiers.nvme import NvmeTier  # noqa: E402

GEO = ModelGeometry.from_dict({
    "name": "tiny", "architecture": "qwen3_5_text", "hidden_size": 8, "vocab_size": 151_936,
    "layers": ["gdn+mlp", "attention+mlp"],
    "attention": {"num_heads": 1, "num_kv_heads": 1, "head_dim": 4},
    "gdn": {"num_k_heads": 1, "num_v_heads": 1, "head_k_dim": 2, "head_v_dim": 2, "conv_kernel": 2},
    "mlp": {"intermediate_size": 16},
})
BIG = {k: 1 << 40 for k in ObjectKind}


def store(path: Path) -> TieredStore:
    return TieredStore([NvmeTier(path, BIG, fsync=False)])


def fill(path: Path, n_objects: int) -> tuple[list[np.ndarray], int]:
    cfg = load_config(overrides={"chunk_size": 256, "hash_block_size": 16, "alignment": 16},
                      environ={})
    cache = assemble.cache(cfg, GEO, store(path))
    rng = np.random.default_rng(0)
    kvb, sb = GEO.kv_bytes_per_token(), GEO.state_bytes()
    prompts = []
    shared = [rng.integers(0, 150_000, 512) for _ in range(8)]
    bar = tqdm(total=n_objects, desc="saving objects", disable=not sys.stderr.isatty())
    while len(cache.index.where) < n_objects:
        prompt = np.r_[shared[len(prompts) % 8], rng.integers(0, 150_000, 1536)]
        prompts.append(prompt)
        s = RequestSession(cache, prompt)
        s.load()
        s.release()
        s.save_prefill(lambda a, b: torch.ones((b - a) * kvb, dtype=torch.uint8),
                       {q: torch.ones(sb, dtype=torch.uint8) for q in s.checkpoints})
        s.finish(lambda a, b: torch.ones((b - a) * kvb, dtype=torch.uint8),
                 {len(prompt): torch.ones(sb, dtype=torch.uint8)})
        bar.n = len(cache.index.where)
        bar.refresh()
    bar.close()
    n = len(cache.index.where)
    cache.close()
    return prompts, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,000 objects")
    ap.add_argument("--objects", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(Path(_HERE) / "results" / "warm_restart.json"))
    args = ap.parse_args()
    n_obj = 1000 if args.quick else args.objects
    tmp = Path(tempfile.mkdtemp(prefix="hc-restart-"))
    try:
        prompts, n = fill(tmp / "nvme", n_obj)
        cfg = load_config(overrides={"chunk_size": 256, "hash_block_size": 16, "alignment": 16},
                          environ={})
        tier_s, cache_s = [], []
        for _ in range(args.reps):
            t = time.perf_counter()
            tier = NvmeTier(tmp / "nvme", BIG, fsync=False)
            tier_s.append(time.perf_counter() - t)
            tier.close()
            t = time.perf_counter()
            cache = assemble.cache(cfg, GEO, store(tmp / "nvme"))
            cache_s.append(time.perf_counter() - t)
            rebuilt = cache.rebuilt
            first = cache.lookup(np.r_[prompts[-1], [7]])
            cache.close()
        res = {"objects": n, "tier_start_s": min(tier_s), "cache_start_s": min(cache_s),
               "rebuild_over_tier": min(cache_s) / min(tier_s),
               "objects_per_s": n / min(cache_s), "indexed": rebuilt.indexed,
               "unlinked": len(rebuilt.unlinked), "first_request_hit_tokens": first.num_tokens,
               "first_request_prompt_tokens": first.prompt_tokens}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"warm restart over {n} objects on NVMe (best of {args.reps})")
    print(f"  NVMe tier start alone  {res['tier_start_s']:.3f} s")
    print(f"  whole cache start      {res['cache_start_s']:.3f} s  ({res['objects_per_s']:.0f} objects/s, "
          f"{res['rebuild_over_tier']:.2f}x the tier alone)")
    print(f"  re-linked {res['indexed']}, unlinked {res['unlinked']}")
    print(f"  first request: {res['first_request_hit_tokens']} of {res['first_request_prompt_tokens']} tokens hit")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
