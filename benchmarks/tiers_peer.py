"""Peer comparison: our host and NVMe tiers against LMCache 0.5.6's ``LocalCPUBackend`` and
``LocalDiskBackend`` (instantiated on CPU with its own config, allocator, MemoryObjs and
async put tasks) and plain file IO, on the same objects (sized from a model preset as in
``benchmarks/tiers.py``), interleaved (the order of the sides rotates each rep), best-of and
median, as ratios, for put, warm get and cold get (page cache dropped per file) of each
kind, with fairness notes printed (who fsyncs, who checksums, threads) and written to
``benchmarks/results/tiers_peer[_quick].json``. Every side's read-back is checked bit-exact.
If LMCache cannot be loaded the section says why and compares against plain IO only.

    python benchmarks/tiers_peer.py [--quick] [--io-threads 4] [--kinds kv,anchor]
"""

# ruff: noqa: E402  (imports follow the sys.path fix below)
from __future__ import annotations

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hybrid_connector.bench.peers import load_lmcache  # one loader for both peer benchmarks
from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.nvme import NvmeTier
from hybrid_connector.tiers.tier import Tier, copy_into

# the shared helpers of benchmarks/tiers.py (named like the tiers package: load it by path)
_spec = importlib.util.spec_from_file_location("bench_tiers", os.path.join(_HERE, "tiers.py"))
assert _spec is not None and _spec.loader is not None
bench_tiers = importlib.util.module_from_spec(_spec)
sys.modules["bench_tiers"] = bench_tiers  # its dataclasses look their module up
_spec.loader.exec_module(bench_tiers)
K = ObjectKind
objects, DTYPES, object_sizes = bench_tiers.objects, bench_tiers.DTYPES, bench_tiers.object_sizes
file_ops, timed, write_synced = bench_tiers.file_ops, bench_tiers.timed, bench_tiers.write_synced


# ------------------------------------------------------------------ peer: LMCache 0.5.6
SUMMARY_PEERS = ("lmc-disk", "plain")  # the baselines the summary compares our nvme tier with
FAIRNESS = [
    "nvme (ours): fsync of every file + one directory fsync per batch before put returns; "
    "xxh3-128 checksum computed on put and verified on every read; header, index rebuilt "
    "at start; {threads} I/O threads per batch.",
    "lmc-disk (LMCache LocalDiskBackend): no fsync, no checksum, writes straight to the "
    "final name (a crash can leave a torn file), in-memory index only; 4 writer threads "
    "(its default) behind its asyncio put tasks; batched_get_blocking reads on a pool of 4.",
    "plain: write + fsync per object on one thread (put); readinto on one thread (get); "
    "no header, checksum or index. plain-par: the same writes on {threads} threads, one "
    "fsync per file (the device's durable-write ceiling here), and its reads on as many "
    "threads; plain-par-x: plain-par reads that hash every 256 KiB piece (xxh3-128) while "
    "it is in cache (the ceiling of a reader that checks every byte, as ours does). "
    "o_direct: plain's files "
    "read with O_DIRECT into aligned buffers (what O_DIRECT reads would give).",
    "nvme-nf (ours, disk_fsync false): as nvme without any fsync (LMCache's durability), "
    "checksums still on. nvme-nv (ours, disk_verify_reads false): as nvme (fsync on) "
    "with reads that check header, key, sizes but not the payload's checksum.",
    "host (ours) / lmc-cpu (LocalCPUBackend): both copy the payload in on put (ours into a "
    "slab, LMCache into a MemoryObj from its allocator); on get both copy into a caller "
    "buffer (LMCache: get_blocking + copy). One thread each, no checksum.",
    "LMCache's put is timed from submit to the completion callback of the last object; its "
    "MemoryObjs are filled before the timer (they stand for its CPU staging buffers), its "
    "get is timed to its own MemoryObjs (it allocates them: no caller-buffer copy).",
    "LMCache is loaded without running its lmcache.v1.storage_backend package __init__, "
    "which imports every backend (GDS, NIXL, remote: aiofile, cryptography, ... are not "
    "installed here); the two backends' own modules run unchanged.",
    "cold gets: every file of the side fsynced and dropped from the page cache "
    "(posix_fadvise DONTNEED) before the timed read; the order of sides rotates each rep.",
]


def drop_cache(paths: list[Path]) -> None:
    """Make each file's pages clean (fsync), then drop them from the page cache."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_in(d: Path) -> Callable[[], list[Path]]:
    return lambda: [p for p in d.iterdir() if p.is_file()]


@dataclass
class Side:
    """One side of the peer comparison: put/get of the same objects, a files listing for
    cold reads (None: a memory side), and a bit-exact check of what get returned."""

    put: Callable[[], None]
    get: Callable[[], None]
    before_put: Callable[[], None]
    check: Callable[[], bool]
    files: Callable[[], list[Path]] | None = None
    after_get: Callable[[], None] = lambda: None
    close: Callable[[], None] = lambda: None


def tier_side(tier: Tier, items: list[tuple[ObjectKey, torch.Tensor]], files: Path | None) -> Side:
    keys = [k for k, _ in items]
    outs = [torch.empty_like(t) for _, t in items]

    def put() -> None:
        if not all(tier.put(items)):
            raise RuntimeError(f"{tier.name}: put failed")

    def get() -> None:
        if not all(tier.get_into(keys, outs)):
            raise RuntimeError(f"{tier.name}: get failed")

    def clear() -> None:
        tier.remove(keys)

    return Side(put, get, clear,
                lambda: all(torch.equal(o.view(torch.uint8), t.view(torch.uint8))
                            for o, (_, t) in zip(outs, items, strict=True)),
                files_in(files) if files else None, close=tier.close)


def plain_side(items: list[tuple[ObjectKey, torch.Tensor]], d: Path, threads: int,
               verify: bool = False) -> Side:
    """Plain files: with ``threads`` > 1 the writes and the reads of a batch run on a pool
    of that size; ``verify``: every piece read is hashed (xxh3-128) while in cache and the
    digest checked (what any reader that checks every byte pays on top of the copy)."""
    import xxhash

    base = file_ops(items, d)
    from concurrent.futures import ThreadPoolExecutor

    views = [t.reshape(-1).view(torch.uint8).numpy().data for _, t in items]
    back = [bytearray(len(v)) for v in views]
    sums = [xxhash.xxh3_128(v).digest() for v in views] if verify else []
    pool = ThreadPoolExecutor(threads)

    def write(i: int) -> None:
        write_synced(d / f"plain{i}", views[i])

    def read(i: int) -> None:
        if not verify:
            with open(d / f"plain{i}", "rb", buffering=0) as f:
                f.readinto(back[i])
            return
        # the cheapest verifying read known here: each 256 KiB piece hashed while in cache
        h, m, off = xxhash.xxh3_128(), memoryview(back[i]), 0
        with open(d / f"plain{i}", "rb", buffering=0) as f:
            while off < len(m):
                n = f.readinto(m[off : off + (1 << 18)])
                if not n:
                    raise RuntimeError("plain-par-x: short file")
                h.update(m[off : off + n])
                off += n
        if h.digest() != sums[i]:
            raise RuntimeError("plain-par-x: checksum mismatch")

    def get() -> None:
        if threads == 1:
            for i in range(len(back)):
                read(i)
        else:
            list(pool.map(read, range(len(back))))

    def put() -> None:
        list(pool.map(write, range(len(views))))

    def close() -> None:
        pool.shutdown()
        base.close()

    return Side(base.put if threads == 1 else put, get, base.before_put,
                lambda: all(bytes(b) == bytes(v) for b, v in zip(back, views, strict=True)),
                files_in(d), close=close)


def direct_side(items: list[tuple[ObjectKey, torch.Tensor]], d: Path) -> Side:
    """Plain files read with O_DIRECT into page-aligned buffers (no page cache): what
    O_DIRECT would give the tier's reads, warm and cold. Puts as ``plain``."""
    import mmap

    base = plain_side(items, d, 1)
    sizes = [t.numel() * t.element_size() for _, t in items]
    bufs = [mmap.mmap(-1, (n + 4095) // 4096 * 4096) for n in sizes]

    def get() -> None:
        for i, b in enumerate(bufs):
            fd = os.open(d / f"plain{i}", os.O_RDONLY | os.O_DIRECT)
            try:
                os.preadv(fd, [b], 0)
            finally:
                os.close(fd)

    def check() -> bool:
        return all(b[:n] == t.reshape(-1).view(torch.uint8).numpy().tobytes()
                   for b, n, (_, t) in zip(bufs, sizes, items, strict=True))

    return Side(base.put, get, base.before_put, check, base.files, close=base.close)


def lmc_sides(lm: dict[str, Any], items: list[tuple[ObjectKey, torch.Tensor]], d: Path,
              tag: int) -> tuple[Side, Side]:
    """(lmc-cpu, lmc-disk) on the same objects, each with its own config and allocator."""
    import asyncio
    import threading

    total = sum(t.numel() * t.element_size() for _, t in items)
    gib = 1024**3
    keys = [lm["Key"]("bench", 1, 0, tag * 100_000 + i, t.dtype) for i, (_, t) in enumerate(items)]
    # Disk accounting only: LMCache's remove does not give back current_cache_size, so the
    # limit must cover every rep's puts.
    cfg_d = lm["Config"].from_defaults(chunk_size=256, local_cpu=False, max_local_cpu_size=1.0,
                                       local_disk=str(d), max_local_disk_size=1000.0)
    cfg_c = lm["Config"].from_defaults(chunk_size=256, local_cpu=True,
                                       max_local_cpu_size=(total * 2 + (64 << 20)) / gib)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    alloc_d = lm["Alloc"](total * 2 + (64 << 20))
    cpu_d = lm["Cpu"](cfg_d, memory_allocator=alloc_d)
    disk = lm["Disk"](cfg_d, loop, cpu_d)
    cpu = lm["Cpu"](cfg_c, memory_allocator=lm["Alloc"](total * 2 + (64 << 20)))

    def mobj(backend: Any, t: torch.Tensor) -> Any:
        m = backend.allocate(t.shape, t.dtype, lm["fmt"])
        if m is None:
            raise RuntimeError("LMCache allocator is full")
        copy_into(m.tensor, t)
        return m

    staged = [mobj(cpu_d, t) for _, t in items]  # the disk backend's source buffers
    got: list[Any] = []
    done = threading.Semaphore(0)

    def dput() -> None:
        disk.batched_submit_put_task(keys, staged, on_complete_callback=lambda _k: done.release())
        for _ in keys:
            if not done.acquire(timeout=120):
                raise RuntimeError("lmc-disk: put did not complete")

    def dget() -> None:
        got[:] = disk.batched_get_blocking(keys)
        if any(m is None for m in got):
            raise RuntimeError("lmc-disk: get failed")

    def release() -> None:
        for m in got:
            if m is not None:
                m.ref_count_down()
        got.clear()

    def dclear() -> None:
        for k in keys:
            disk.remove(k)

    def same(ms: list[Any]) -> bool:
        return all(torch.equal(m.tensor.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
                   for m, (_, t) in zip(ms, items, strict=True))

    def dclose() -> None:
        release()
        disk.close()
        for m in staged:
            m.ref_count_down()
        loop.call_soon_threadsafe(loop.stop)

    disk_side = Side(dput, dget, dclear, lambda: same(got), files_in(d), after_get=release, close=dclose)

    outs = [torch.empty_like(t) for _, t in items]

    def cput() -> None:
        for k, (_, t) in zip(keys, items, strict=True):
            m = mobj(cpu, t)
            cpu.submit_put_task(k, m)
            m.ref_count_down()  # the backend holds its own reference now

    def cget() -> None:
        for k, o in zip(keys, outs, strict=True):
            m = cpu.get_blocking(k)
            if m is None:
                raise RuntimeError("lmc-cpu: get failed")
            copy_into(o, m.tensor.reshape(o.shape))
            m.ref_count_down()

    def cclear() -> None:
        for k in keys:
            cpu.remove(k)

    def cclose() -> None:
        cclear()
        cpu.close()

    cpu_side = Side(cput, cget, cclear,
                    lambda: all(torch.equal(o.view(torch.uint8), t.view(torch.uint8))
                                for o, (_, t) in zip(outs, items, strict=True)),
                    close=cclose)
    return cpu_side, disk_side


def bench_peer(sides: dict[str, Side], reps: int) -> dict[str, dict[str, list[float]]]:
    """Interleaved runs: each rep puts on every side, then gets warm, then gets cold (page
    cache dropped), rotating the order of the sides; every side's first get is checked
    bit-exact. Returns the times per side and operation."""
    names = list(sides)
    t: dict[str, dict[str, list[float]]] = {n: {"put": [], "get": [], "cold": []} for n in names}
    for s in sides.values():  # warm-up round (first-touch faults, pools), checked
        s.before_put()
        s.put()
        s.get()
        if not s.check():
            raise RuntimeError("a side read back different bytes")
        s.after_get()
    for r in range(reps):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            t[n]["put"].append(timed(sides[n].put, sides[n].before_put))
        for n in order:
            t[n]["get"].append(timed(sides[n].get, lambda: None))
            sides[n].after_get()
        for n in order:
            fl = sides[n].files
            if fl is None:
                continue
            t[n]["cold"].append(timed(sides[n].get, lambda f=fl: drop_cache(f())))  # type: ignore[misc]
            sides[n].after_get()
    return t


def run_peer(args: argparse.Namespace, sizes: dict[ObjectKind, tuple[int, int]],
             dtypes: dict[ObjectKind, torch.dtype], work: Path, reps: int) -> dict[str, Any]:
    lm, why = load_lmcache()
    threads = args.io_threads
    res: dict[str, Any] = {"preset": args.preset, "reps": reps, "io_threads": threads,
                           "cpus": os.cpu_count(), "quick": bool(args.quick),
                           "loadavg_start": os.getloadavg(),
                           "lmcache": lm["version"] if lm else None, "lmcache_unavailable": why or None,
                           "fairness": [f.format(threads=threads) for f in FAIRNESS], "kinds": []}
    print(f"\nPeer comparison ({args.preset}; {reps} interleaved reps; ratio = peer time / our "
          f"time, > 1 means ours is faster)")
    if lm is None:
        print(f"  LMCache's backends cannot run here: {why}. Only the plain-IO comparison is shown.")
    for note in res["fairness"]:
        print(f"  - {note}")
    for i, kind in enumerate(K):
        if args.kinds and kind.value not in args.kinds.split(","):
            continue
        nbytes, count = sizes[kind]
        items = objects(kind, nbytes, count, dtypes[kind])
        total = sum(t.numel() * t.element_size() for _, t in items)
        budget = {k: total * 2 for k in K}
        sides: dict[str, Side] = {
            "host": tier_side(HostTier(budget), items, None),
            "nvme": tier_side(NvmeTier(work / f"peer-nvme-{kind.value}", budget, io_threads=threads),
                              items, work / f"peer-nvme-{kind.value}"),
            "plain": plain_side(items, work / f"peer-plain-{kind.value}", 1),
            "plain-par": plain_side(items, work / f"peer-plainpar-{kind.value}", threads),
            "plain-par-x": plain_side(items, work / f"peer-plainparx-{kind.value}", threads,
                                      verify=True),
            "o_direct": direct_side(items, work / f"peer-direct-{kind.value}"),
            "nvme-nf": tier_side(NvmeTier(work / f"peer-nvmenf-{kind.value}", budget, fsync=False,
                                          io_threads=threads), items, work / f"peer-nvmenf-{kind.value}"),
            "nvme-nv": tier_side(NvmeTier(work / f"peer-nvmenv-{kind.value}", budget,
                                          verify_reads=False, io_threads=threads),
                                 items, work / f"peer-nvmenv-{kind.value}"),
        }
        if lm is not None:
            d = work / f"peer-lmc-{kind.value}"
            d.mkdir(parents=True, exist_ok=True)
            sides["lmc-cpu"], sides["lmc-disk"] = lmc_sides(lm, items, d, i)
        try:
            t = bench_peer(sides, reps)
        finally:
            for s in sides.values():
                s.close()
        stat = {n: {op: {"best_s": min(v), "median_s": float(np.median(v))} for op, v in ops.items() if v}
                for n, ops in t.items()}
        ratios: dict[str, Any] = {}
        pairs = [("nvme", "plain"), ("nvme", "plain-par"), ("nvme", "o_direct"), ("host", "lmc-cpu"),
                 ("nvme", "lmc-disk"), ("nvme-nf", "lmc-disk"), ("nvme-nv", "lmc-disk")]
        for ours, peer in pairs:
            if peer not in stat:
                continue
            ratios[f"{ours}/{peer}"] = {
                op: {agg: stat[peer][op][f"{agg}_s"] / stat[ours][op][f"{agg}_s"] for agg in ("best", "median")}
                for op in ("put", "get", "cold") if op in stat[ours] and op in stat[peer]}
        if "lmc-disk" in stat:  # what any fsyncing writer / verifying reader reached here
            ratios["plain-par/lmc-disk"] = {"put": {
                agg: stat["lmc-disk"]["put"][f"{agg}_s"] / stat["plain-par"]["put"][f"{agg}_s"]
                for agg in ("best", "median")}}
            ratios["plain-par-x/lmc-disk"] = {"get": {
                agg: stat["lmc-disk"]["get"][f"{agg}_s"] / stat["plain-par-x"]["get"][f"{agg}_s"]
                for agg in ("best", "median")}}
        res["kinds"].append({"kind": kind.value, "objects": count, "MB": total / 1e6,
                             "times": stat, "ratios": ratios})
        print(f"\n  {kind.value}: {count} objects, {total / 1e6:.1f} MB")
        print(f"  {'side':10} {'put GB/s best/med':>18} {'get GB/s best/med':>18} {'cold GB/s best/med':>19}")
        for n, ops in stat.items():
            cells = [f"{total / ops[op]['best_s'] / 1e9:8.2f}/{total / ops[op]['median_s'] / 1e9:<8.2f}"
                     if op in ops else f"{'-':>17}" for op in ("put", "get", "cold")]
            print(f"  {n:10} {cells[0]:>18} {cells[1]:>18} {cells[2]:>19}")
        for pair, ops in ratios.items():
            print(f"  ratio {pair:15} " + "  ".join(
                f"{op} {v['best']:.2f}/{v['median']:.2f}" for op, v in ops.items()))
    worst_ratio: dict[str, float] = {}
    print("\nOur nvme tier against the peers measured in this run (best-of ratios, peer time / "
          "our time: above 1, ours is faster; fsync and checksums on; cold reads in the tables above):")
    for peer in SUMMARY_PEERS:
        for op in ("put", "get"):
            vals = [(k["kind"], k["ratios"][f"nvme/{peer}"][op]["best"]) for k in res["kinds"]
                    if f"nvme/{peer}" in k["ratios"]]
            if not vals:
                continue
            worst_ratio[f"nvme/{peer} {op}"] = round(min(v for _, v in vals), 3)
            print(f"  nvme {op} vs {peer}: " + ", ".join(f"{k} {v:.2f}x" for k, v in vals)
                  + f" (worst {min(v for _, v in vals):.2f}x)")
    for pair, op, what, why in (
            ("plain-par/lmc-disk", "put", "durable-write ceiling: plain parallel writes with "
             "fsync", "puts, which never wait for the device"),
            ("plain-par-x/lmc-disk", "get", "verifying-read ceiling: plain parallel reads "
             "hashing every piece in cache", "gets, which check nothing")):
        ceil = [(k["kind"], k["ratios"][pair][op]["best"]) for k in res["kinds"] if pair in k["ratios"]]
        if ceil:
            print(f"  ({what} reach " + ", ".join(f"{k} {v:.2f}" for k, v in ceil)
                  + f" of lmc-disk's {why})")
    res["worst_ratio"] = worst_ratio
    res["loadavg_end"] = os.getloadavg()  # a shared machine: how busy it was
    return res


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small objects, few reps (~16 s)")
    ap.add_argument("--preset", default="qwen3.5-4b", help="model preset sizing the objects")
    ap.add_argument("--chunk", type=int, default=256, help="KV chunk size in tokens")
    ap.add_argument("--dir", default=None, help="working directory (default: a temp dir)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--json", default=None, help="default: benchmarks/results/tiers_peer[_quick].json")
    ap.add_argument("--io-threads", type=int, default=4, help="nvme tier I/O threads")
    ap.add_argument("--kinds", default="", help="only these kinds (e.g. kv,anchor)")
    args = ap.parse_args(argv)
    reps = args.reps or (5 if args.quick else 9)
    sizes = object_sizes(args.preset, args.chunk, args.quick)
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="hc-peer-"))
    peer = run_peer(args, sizes, DTYPES, work, reps)
    out = args.json or os.path.join(_HERE, "results", f"tiers_peer{'_quick' if args.quick else ''}.json")
    Path(out).write_text(json.dumps(peer, indent=2))
    print(f"\nwrote {out}")
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
