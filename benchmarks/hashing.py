"""Hashing cost of a save: the last 256 tokens of a 128K-token sequence vs the first 256.

Three ways to key the chunk ``[n, n + 256)`` of a growing sequence, each timed at n = 0 and
at n = 131072 - 256 (best of several interleaved runs, one thread):

* ``scratch``: ``keys.PrefixHasher`` over ``tokens[:n + 256]`` (what a save without a
  request's hashes does: O(n));
* ``chain``: the request's ``ChainHasher`` appended the 256 new tokens (O(256));
* ``save``: the whole ``HybridCache.save`` of that chunk through the index (keys, radix
  insert resumed from the request's previous save, ledger, policy bookkeeping) over a
  size-only store, with the request's ``ChainHasher``.

The claim is a ratio measured in the same run: last / first close to 1 for ``chain`` and
``save``, while ``scratch`` grows with n. Usage: ``python benchmarks/hashing.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hybrid_connector import assemble  # noqa: E402
from hybrid_connector.core.config import load_config  # noqa: E402
from hybrid_connector.core.hashes import ChainHasher  # noqa: E402
from hybrid_connector.core.keys import ObjectKind, PrefixHasher  # noqa: E402
from hybrid_connector.geometry.presets import get_preset  # noqa: E402
from hybrid_connector.index.plan import SaveItem  # noqa: E402
from hybrid_connector.tiers.size_only import Budget, SizeOnlyStore, zero_payload  # noqa: E402

CHUNK = 256


def best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def run(n_tokens: int, repeat: int) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 150_000, n_tokens).astype(np.int64)
    cfg = load_config(overrides={"chunk_size": CHUNK, "hash_block_size": 16, "alignment": 16},
                      environ={})
    geo = get_preset("qwen3.5-0.8b")
    last = n_tokens - CHUNK
    out: dict[str, dict[str, float]] = {}

    def scratch(n: int) -> float:
        return best(lambda: PrefixHasher(toks[: n + CHUNK], 16).at(n + CHUNK), repeat)

    def chain(n: int) -> float:
        base = ChainHasher(16, toks[:n])
        times = []
        for _ in range(repeat):
            ch = ChainHasher(16)
            ch._buf, ch._n, ch._blocks = base._buf.copy(), base._n, list(base._blocks)
            t = time.perf_counter()
            ch.append(toks[n : n + CHUNK])
            ch.at(n + CHUNK)
            times.append(time.perf_counter() - t)
        return min(times)

    def save(n: int) -> float:
        times = []
        for _ in range(max(2, repeat // 4)):
            store = SizeOnlyStore(Budget.per_kind({ObjectKind.KV: 10**15, ObjectKind.STATE: 10**15}))
            cache = assemble.cache(cfg, geo, store)
            ch = ChainHasher(16)
            kvb = geo.kv_bytes_per_token()
            leaf = None
            for s in range(0, n, CHUNK):  # the request so far, chunk by chunk
                ch.append(toks[s : s + CHUNK])
                leaf = cache.save(toks[: s + CHUNK], [SaveItem(ObjectKind.KV, s, s + CHUNK,
                                  zero_payload(CHUNK * kvb))], hashes=ch, start=leaf).leaf
            item = SaveItem(ObjectKind.KV, n, n + CHUNK, zero_payload(CHUNK * kvb))
            t = time.perf_counter()
            ch.append(toks[n : n + CHUNK])
            r = cache.save(toks[: n + CHUNK], [item], hashes=ch, start=leaf)
            times.append(time.perf_counter() - t)
            assert r.stored == 1
            cache.close()
        return min(times)

    torch.set_num_threads(1)
    for name, fn in (("scratch", scratch), ("chain", chain), ("save", save)):
        first, end = fn(0), fn(last)
        out[name] = {"first_us": first * 1e6, "last_us": end * 1e6, "ratio": end / first}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="32K tokens, fewer repeats")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "hashing.json"))
    args = ap.parse_args()
    n = 32768 if args.quick else 131072
    res = run(n, 5 if args.quick else 15)
    print(f"saving the chunk [n, n+{CHUNK}) of a {n}-token sequence: n = 0 vs n = {n - CHUNK}")
    print(f"{'method':<10}{'first (us)':>12}{'last (us)':>12}{'last/first':>12}")
    for name, r in res.items():
        print(f"{name:<10}{r['first_us']:>12.1f}{r['last_us']:>12.1f}{r['ratio']:>12.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"tokens": n, "chunk": CHUNK, **res}, indent=2))


if __name__ == "__main__":
    main()
