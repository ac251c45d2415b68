"""Peers on the same objects: our host and NVMe tiers against LMCache 0.5.6's own
``LocalCPUBackend`` and ``LocalDiskBackend`` (its config, allocator, MemoryObjs and async
put tasks, on CPU), put and get throughput, best of ``reps`` interleaved rounds, as
ratios (LMCache's time / ours: > 1 means ours is faster). Every read-back is checked
bit-exact on both sides. When LMCache cannot be loaded the result says why (never a
made-up figure). ``benchmarks/tiers_peer.py`` is the full comparison (cold reads, plain
file IO, fairness notes).

LMCache's ``lmcache.v1.storage_backend`` package imports every backend in its
``__init__`` (GDS, NIXL, remote connectors: modules that are not installed on CPU); the two
backend modules are loaded without it, which is the only liberty taken.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.nvme import NvmeTier
from hybrid_connector.tiers.tier import copy_into


def load_lmcache() -> tuple[dict[str, Any] | None, str]:
    """LMCache's two local backends and what they need, or (None, why not)."""
    import importlib.util

    try:
        if importlib.util.find_spec("lmcache") is None:
            return None, ("lmcache is not installed (EXTRAS='[lmcache]' bash scripts/setup.sh, "
                          "or pip install 'hybrid-connector[lmcache]')")
        spec = importlib.util.find_spec("lmcache.v1")
        if spec is None or spec.origin is None:
            return None, "lmcache is not installed (pip install 'hybrid-connector[lmcache]')"
        if "lmcache.v1.storage_backend" not in sys.modules:
            pkg = types.ModuleType("lmcache.v1.storage_backend")
            pkg.__path__ = [os.path.join(os.path.dirname(spec.origin), "storage_backend")]
            sys.modules["lmcache.v1.storage_backend"] = pkg
        os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")  # its loggers ignore the root level
        from importlib.metadata import version

        from lmcache.utils import CacheEngineKey
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.memory_allocators.mixed_memory_allocator import MixedMemoryAllocator
        from lmcache.v1.memory_management import MemoryFormat
        from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
        from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend
        return {"Key": CacheEngineKey, "Config": LMCacheEngineConfig, "Alloc": MixedMemoryAllocator,
                "fmt": MemoryFormat.KV_2LTD, "Cpu": LocalCPUBackend, "Disk": LocalDiskBackend,
                "version": version("lmcache")}, ""
    except Exception as exc:  # any import failure: say why, never fake numbers
        return None, f"{type(exc).__name__}: {exc}"


def _best(fn: Callable[[], None], before: Callable[[], None]) -> float:
    before()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _objects(sizes: dict[ObjectKind, tuple[int, int]]) -> list[tuple[ObjectKey, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for kind, (nbytes, count) in sizes.items():
        for i in range(count):
            key = ObjectKey("bench-peer", i.to_bytes(8, "little") + kind.value.encode(), kind,
                            0 if kind is ObjectKind.STATE else i, i + 1)
            # [1, 1, tokens, 1]: LMCache's KV_2LTD MemoryObjs read a token dim (2) back
            data = torch.randint(0, 256, (1, 1, nbytes, 1), dtype=torch.uint8, generator=g)
            out.append((key, data))
    return out


def run_peers(sizes: dict[ObjectKind, tuple[int, int]], work: Path, reps: int,
              fsync: bool) -> dict[str, Any]:
    """Put/get of the same objects (``sizes``: kind -> (bytes, count)) on both sides."""
    lm, why = load_lmcache()
    items = _objects(sizes)
    total = sum(t.numel() for _, t in items)
    res: dict[str, Any] = {"objects": {k.value: {"bytes": n, "count": c} for k, (n, c) in sizes.items()},
                           "MB": total / 1e6, "reps": reps, "lmcache": lm["version"] if lm else None,
                           "unavailable": why or None, "ratios": {}, "seconds": {}}
    if lm is None:
        return res
    budget = {k: total * 2 for k in ObjectKind}
    host, nvme = HostTier(budget), NvmeTier(str(work / "peer-nvme"), budget, fsync=fsync)
    keys = [k for k, _ in items]
    outs = [torch.empty_like(t) for _, t in items]

    def ours_put(tier: Any) -> Callable[[], None]:
        return lambda: None if all(tier.put(items)) else _fail(tier.name)

    def ours_get(tier: Any) -> Callable[[], None]:
        def get() -> None:
            if not all(tier.get_into(keys, outs)) or not all(
                    torch.equal(o, t) for o, (_, t) in zip(outs, items, strict=True)):
                _fail(tier.name)
        return get

    d = work / "peer-lmc"
    d.mkdir(parents=True, exist_ok=True)
    gib = 1024**3
    lkeys = [lm["Key"]("bench", 1, 0, i, torch.uint8) for i in range(len(items))]
    cfg_d = lm["Config"].from_defaults(chunk_size=256, local_cpu=False, max_local_cpu_size=1.0,
                                       local_disk=str(d), max_local_disk_size=1000.0)
    cfg_c = lm["Config"].from_defaults(chunk_size=256, local_cpu=True,
                                       max_local_cpu_size=(total * 2 + (64 << 20)) / gib)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    cpu_d = lm["Cpu"](cfg_d, memory_allocator=lm["Alloc"](total * 2 + (64 << 20)))
    disk = lm["Disk"](cfg_d, loop, cpu_d)
    cpu = lm["Cpu"](cfg_c, memory_allocator=lm["Alloc"](total * 2 + (64 << 20)))

    def mobj(backend: Any, t: torch.Tensor) -> Any:
        m = backend.allocate(t.shape, t.dtype, lm["fmt"])
        copy_into(m.tensor, t)
        return m

    staged = [mobj(cpu_d, t) for _, t in items]
    done = threading.Semaphore(0)

    def dput() -> None:
        disk.batched_submit_put_task(lkeys, staged, on_complete_callback=lambda _k: done.release())
        for _ in lkeys:
            if not done.acquire(timeout=120):
                _fail("lmc-disk")

    def dget() -> None:
        got = disk.batched_get_blocking(lkeys)
        ok = all(m is not None and torch.equal(m.tensor.reshape(-1)[: t.numel()], t.reshape(-1))
                 for m, (_, t) in zip(got, items, strict=True))
        for m in got:
            if m is not None:
                m.ref_count_down()
        if not ok:
            _fail("lmc-disk")

    def cput() -> None:
        for k, (_, t) in zip(lkeys, items, strict=True):
            m = mobj(cpu, t)
            cpu.submit_put_task(k, m)
            m.ref_count_down()

    def cget() -> None:
        for k, o, (_, t) in zip(lkeys, outs, items, strict=True):
            m = cpu.get_blocking(k)
            if m is None:
                _fail("lmc-cpu")
            copy_into(o, m.tensor.reshape(o.shape))
            m.ref_count_down()
            if not torch.equal(o, t):
                _fail("lmc-cpu")

    sides = {
        "host": (ours_put(host), ours_get(host), lambda: _each(host.remove, [keys])),
        "nvme": (ours_put(nvme), ours_get(nvme), lambda: _each(nvme.remove, [keys])),
        "lmc-cpu": (cput, cget, lambda: _each(cpu.remove, lkeys)),
        "lmc-disk": (dput, dget, lambda: _each(disk.remove, lkeys)),
    }
    times: dict[str, dict[str, list[float]]] = {n: {"put": [], "get": []} for n in sides}
    try:
        for r in range(reps + 1):  # round 0 warms up (first-touch faults, pools)
            for name, (put, get, clear) in sides.items():
                tp = _best(put, clear)
                tg = _best(get, lambda: None)
                if r:
                    times[name]["put"].append(tp)
                    times[name]["get"].append(tg)
    finally:
        host.close()
        nvme.close()
        disk.close()
        for m in staged:
            m.ref_count_down()
        cpu.close()
        loop.call_soon_threadsafe(loop.stop)
    best = {n: {op: min(v) for op, v in ops.items()} for n, ops in times.items()}
    res["seconds"] = best
    res["fsync"] = fsync
    for ours, peer in (("host", "lmc-cpu"), ("nvme", "lmc-disk")):
        res["ratios"][f"{ours}/{peer}"] = {op: best[peer][op] / best[ours][op] for op in ("put", "get")}
    res["notes"] = ("ratio = LMCache's time / ours (> 1: ours faster), best of the rounds; "
                    f"our NVMe tier fsyncs every file: {fsync}, checksums every read; "
                    "LMCache's disk backend neither fsyncs nor checksums")
    return res


def _each(fn: Callable[[Any], object], args: list[Any]) -> None:
    for a in args:
        fn(a)


def _fail(side: str) -> None:
    raise RuntimeError(f"peer benchmark: {side} failed or read back different bytes")
