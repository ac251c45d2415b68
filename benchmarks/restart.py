"""Warm restart: what object metadata costs an NVMe tier at start, on disk and in RAM.

Writes N objects (default 10,000; ``--quick``: 1,000) of realistic kinds into two NvmeTier
directories, the same keys and payloads in both: one with ``ObjectMeta`` (what an index
needs to re-link every object after a restart), one without. The objects come from
sequences of 2,048 random tokens (vocabulary 151,936, so 4-byte token ids; prefix hashes
over vLLM's 16-token hash blocks); each sequence gives 8 KV chunks of 256 tokens (16 KiB
payloads, metadata: 256 tokens + 16 block hashes), 4 anchor pages over every other chunk
(4 KiB, the same metadata shape) and 2 state checkpoints (8 KiB, metadata: the prefix hash
only). Payloads are small to keep disk use modest: the metadata cost per object does not
depend on them, and the start cost barely does (start reads the first 4 KiB of each file).

Then it times cold NvmeTier starts (the index rebuilt from the directory: listing, one
header read per file, validation, and with metadata its CRC and decoding), alternating
the two directories ``--reps`` times, and prints objects/s and the ratio of start time
with metadata to start time without, measured in the same run, twice: with the files in
the page cache, and after dropping each file's cached pages (``fsync`` + ``posix_fadvise
DONTNEED``; directory entries and inodes stay cached, which needs root to drop). Also
reported: the put cost ratio (fsync off, same batches alternating), the on-disk bytes per
object (the metadata blob and the whole file-size difference, header fields included),
and the RAM the tier's index takes per object (``tracemalloc`` over a start).

    python benchmarks/restart.py [--quick] [--n N] [--reps R] [--dir PATH] [--json OUT]

Results go to ``benchmarks/results/restart.json`` (``restart_quick.json`` with --quick).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import torch

# benchmarks/tiers.py would shadow the ``tiers`` package: drop this directory from the
# path and make the repository root importable.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

from hybrid_connector.core.keys import ObjectKey, ObjectKind, PrefixHasher  # noqa: E402
from hybrid_connector.core.meta import ObjectMeta  # noqa: E402
from hybrid_connector.tiers.nvme import NvmeTier  # noqa: E402

K = ObjectKind
SEQ, CHUNK, BLOCK, VOCAB = 2048, 256, 16, 151_936
PAYLOAD = {K.KV: 16 << 10, K.ANCHOR: 4 << 10, K.STATE: 8 << 10}
BUDGET = {k: 1 << 40 for k in K}
FP = "restartbench0001"


def make_objects(n: int, seed: int = 0) -> list[tuple[ObjectKey, ObjectMeta]]:
    """``n`` (key, meta) pairs from sequences of random tokens (see the module docstring)."""
    rng = np.random.default_rng(seed)
    out: list[tuple[ObjectKey, ObjectMeta]] = []
    while len(out) < n:
        toks = rng.integers(0, VOCAB, SEQ)
        h = PrefixHasher(toks, BLOCK)
        for i, s in enumerate(range(0, SEQ, CHUNK)):
            e = s + CHUNK
            out.append((ObjectKey(FP, h.at(e), K.KV, s, e),
                        ObjectMeta.for_range(toks, s, e, K.KV, h)))
            if i % 2:
                out.append((ObjectKey(FP, h.at(e), K.ANCHOR, s, e),
                            ObjectMeta.for_range(toks, s, e, K.ANCHOR, h)))
        for p in (1000, SEQ):
            out.append((ObjectKey(FP, h.at(p), K.STATE, p, p),
                        ObjectMeta.for_range(toks, p, p, K.STATE, h)))
    return out[:n]


def write(objs: list[tuple[ObjectKey, ObjectMeta]], with_meta: Path, plain: Path,
          batch: int = 64) -> dict[str, float]:
    """Put every object into both directories, batches alternating; put seconds each."""
    pay = {k: torch.from_numpy(np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8))
           for k, n in PAYLOAD.items()}
    tm, tp = NvmeTier(with_meta, BUDGET, fsync=False), NvmeTier(plain, BUDGET, fsync=False)
    spent = {"meta": 0.0, "plain": 0.0}
    for i in range(0, len(objs), batch):
        part = objs[i : i + batch]
        items = [(k, pay[k.kind]) for k, _ in part]
        t0 = time.perf_counter()
        assert all(tm.put(items, [m for _, m in part]))
        t1 = time.perf_counter()
        assert all(tp.put(items))
        spent["meta"] += t1 - t0
        spent["plain"] += time.perf_counter() - t1
    tm.close()
    tp.close()
    return spent


def drop_page_cache(d: Path) -> None:
    """Evict every file of ``d`` from the page cache (clean pages only: fsync first)."""
    for p in d.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def start_seconds(d: Path, cold: bool) -> tuple[float, NvmeTier]:
    if cold:
        drop_page_cache(d)
    gc.collect()
    t0 = time.perf_counter()
    tier = NvmeTier(d, BUDGET)
    return time.perf_counter() - t0, tier


def ram_per_object(d: Path, n: int) -> float:
    """Bytes of Python memory a started tier's index holds per object (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    tier = NvmeTier(d, BUDGET)
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(tier.held_keys()) == n
    tier.close()
    return used / n


def on_disk(objs: list[tuple[ObjectKey, ObjectMeta]], with_meta: Path, plain: Path
            ) -> dict[str, dict[str, float]]:
    """Per kind: mean metadata blob bytes, mean file-size difference, and that
    difference as a fraction of the payload."""
    out: dict[str, dict[str, float]] = {}
    for kind in K:
        sel = [(k, m) for k, m in objs if k.kind is kind]
        if not sel:
            continue
        blob = statistics.fmean(len(m.to_bytes()) for _, m in sel)
        diff = statistics.fmean((with_meta / k.digest()).stat().st_size
                                - (plain / k.digest()).stat().st_size for k, _ in sel)
        out[kind.value] = {"objects": len(sel), "meta_blob_bytes": round(blob, 1),
                           "file_bytes_added": round(diff, 1),
                           "of_payload": round(diff / PAYLOAD[kind], 4)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1,000 objects, 3 reps")
    ap.add_argument("--n", type=int, default=None, help="objects (default 10,000)")
    ap.add_argument("--reps", type=int, default=None, help="starts per directory and mode")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--json", default=None, help="results file")
    args = ap.parse_args(argv)
    n = args.n or (1000 if args.quick else 10_000)
    reps = args.reps or (3 if args.quick else 5)
    out_json = Path(args.json or Path(__file__).parent / "results" /
                    ("restart_quick.json" if args.quick else "restart.json"))
    root = Path(tempfile.mkdtemp(prefix="hc-restart-", dir=args.dir))
    try:
        with_meta, plain = root / "meta", root / "plain"
        objs = make_objects(n)
        put_s = write(objs, with_meta, plain)
        want = dict(objs)
        results: dict[str, Any] = {
            "objects": n, "reps": reps, "payload_bytes": {k.value: v for k, v in PAYLOAD.items()},
            "tokens_per_chunk": CHUNK, "hash_block": BLOCK,
            "put_ratio_meta_over_plain": round(put_s["meta"] / put_s["plain"], 3)}
        for mode, cold in (("page_cache_warm", False), ("page_cache_dropped", True)):
            times: dict[str, list[float]] = {"meta": [], "plain": []}
            for _ in range(reps):
                for name, d in (("meta", with_meta), ("plain", plain)):
                    s, tier = start_seconds(d, cold)
                    inv = tier.inventory()
                    assert len(inv) == n and tier.dropped_at_start == []
                    if name == "meta":  # every object came back with its metadata
                        assert all(want[k] == m for k, _, m in inv)
                    else:
                        assert all(m is None for _, _, m in inv)
                    tier.close()
                    times[name].append(s)
            med = {k: statistics.median(v) for k, v in times.items()}
            results[mode] = {
                "start_s_median": {k: round(v, 4) for k, v in med.items()},
                "start_s_best": {k: round(min(v), 4) for k, v in times.items()},
                "objects_per_s": {k: round(n / v) for k, v in med.items()},
                "ratio_meta_over_plain": round(med["meta"] / med["plain"], 3)}
        results["on_disk"] = on_disk(objs, with_meta, plain)
        ram = {"meta": ram_per_object(with_meta, n), "plain": ram_per_object(plain, n)}
        results["index_ram_bytes_per_object"] = {k: round(v) for k, v in ram.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"warm restart, {n} objects (KV 256 tokens/16 KiB, anchor 4 KiB, state 8 KiB), "
          f"median of {reps} starts each")
    print(f"{'start':<20}{'meta s':>10}{'plain s':>10}{'meta obj/s':>12}{'plain obj/s':>12}"
          f"{'ratio':>8}")
    for mode in ("page_cache_warm", "page_cache_dropped"):
        r = results[mode]
        print(f"{mode:<20}{r['start_s_median']['meta']:>10.3f}{r['start_s_median']['plain']:>10.3f}"
              f"{r['objects_per_s']['meta']:>12}{r['objects_per_s']['plain']:>12}"
              f"{r['ratio_meta_over_plain']:>8.2f}")
    print(f"\n{'kind':<8}{'objects':>8}{'meta blob B':>13}{'file +B':>9}{'of payload':>12}")
    for kind, r in results["on_disk"].items():
        print(f"{kind:<8}{r['objects']:>8}{r['meta_blob_bytes']:>13.0f}{r['file_bytes_added']:>9.0f}"
              f"{r['of_payload']:>12.1%}")
    ram = results["index_ram_bytes_per_object"]
    print(f"\nindex RAM per object: {ram['meta']} B with metadata, {ram['plain']} B without")
    print(f"put time ratio (fsync off): {results['put_ratio_meta_over_plain']:.2f}")
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out_json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
