"""Timing, comparison and reporting helpers of ``bench_hf_ttft`` (the GPU TTFT run)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hybrid_connector.integrations.hf.runtime import HFRuntime

STATE_TOL = 2e-2  # bf16: a few ulps of the tensor's scale; a wrong or missing restore is ~1
LOGIT_TOL = 1e-1  # bf16 suffix GEMMs of other shapes than the full prefill's: the loose check


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(dev: torch.device, fn: Callable[[], Any]) -> tuple[float, Any]:
    sync(dev)
    t0 = time.perf_counter()
    out = fn()
    sync(dev)
    return time.perf_counter() - t0, out


def profile_posts(dev: torch.device, fn: Callable[[], Any], top: int, what: str = "posts") -> None:
    """Print where ``fn`` (``what``: e.g. the kernels' moves of one load) spends its time: the
    ``top`` host functions by own time (cProfile) and device kernels by total time
    (torch.profiler)."""
    import cProfile  # noqa: PLC0415 - diagnostics only
    import io  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    sync(dev)
    prof = cProfile.Profile()
    prof.enable()
    fn()
    sync(dev)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    print(f"{what}, host functions by own time:\n" + text.getvalue())
    acts = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as tp:
        fn()
        sync(dev)
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    print(f"{what}, torch.profiler:\n" + tp.key_averages().table(sort_by=key, row_limit=top))


def prefill_ttft(rt: HFRuntime, prompt: list[int], dev: torch.device) -> tuple[float, Any]:
    """``rt.prefill(prompt)`` and its TTFT: from the call to the last logits computed on the
    device (the saves ``prefill`` makes after them are an engine's background work)."""
    stamps: list[float] = []
    run = rt._run

    def stamped(*args: Any) -> torch.Tensor:
        out = run(*args)
        sync(dev)
        stamps.append(time.perf_counter())
        return out
    rt._run = stamped  # type: ignore[method-assign]
    try:
        sync(dev)
        t0 = time.perf_counter()
        r = rt.prefill(prompt)
    finally:
        rt._run = run  # type: ignore[method-assign]
    return stamps[-1] - t0, r


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over max |want| (on the device; NaN/inf give inf)."""
    d = (got.float() - want.float()).abs().max()
    scale = want.float().abs().max().clamp_min(1e-30)
    r = float((d / scale).item())
    return r if math.isfinite(r) else float("inf")


def copy_bandwidth(dev: torch.device, nbytes: int) -> float:
    """Bytes moved (read + write) per second by a device-to-device ``copy_`` of ``nbytes``."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    b.copy_(a)
    t = min(timed(dev, lambda: b.copy_(a))[0] for _ in range(5))
    return 2 * nbytes / t


def fs_type(path: Path) -> str:
    """The file system holding ``path`` (from /proc/mounts; "?" where unknown): says whether
    the "NVMe" tier really sat on a disk (ext4, xfs) or in memory (tmpfs, overlay on tmpfs)."""
    best, kind = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            _dev, mnt, fs = line.split()[:3]
            if str(path.resolve()).startswith(mnt) and len(mnt) > len(best):
                best, kind = mnt, fs
    except OSError:
        pass
    return kind


def drop_page_cache(root: Path) -> bool:
    """Flush and drop the NVMe tier's files from the page cache, so reads hit the device."""
    ok = True
    for p in root.rglob("*"):
        if p.is_file():
            try:
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            except OSError:
                ok = False
    return ok


def failures(out: dict[str, Any]) -> list[str]:
    """Checks that must hold: exact restores equal to the full prefill's, logits close."""
    bad = list(out["errors"])
    for case in out["cases"]:
        for tier, r in case["tiers"].items():
            for path in ("sync_check", "layerwise_check"):
                c = r.get(path, {})
                for key in ("state_rel_err", "kv_rel_err"):
                    if c.get(key, 0.0) > STATE_TOL:
                        bad.append(f"L={case['prompt_tokens']} {tier} {path}: {key} {c[key]:.3g}")
                if c.get("logits_rel_err", 0.0) > LOGIT_TOL:
                    bad.append(f"L={case['prompt_tokens']} {tier} {path}: logits {c['logits_rel_err']:.3g}")
    return bad


def report(out: dict[str, Any]) -> None:
    """Print the run's figures (the JSON holds them all)."""
    for case in out["cases"]:
        print(f"L={case['prompt_tokens']} (prefix {case['prefix_tokens']}): full prefill "
              f"{case['full_ttft_s'] * 1e3:.1f} ms")
        for tier, r in case["tiers"].items():
            print(f"  {tier:6} sync {r['sync_ttft_s'] * 1e3:8.1f} ms (x{r['ratio_sync']:.1f}) | layer-wise "
                  f"{r['layerwise_ttft_s'] * 1e3:8.1f} ms (x{r['ratio_layerwise']:.1f}) | load "
                  f"{r['load_s'] * 1e3:.1f} ms {r['load_GBps']:.1f} GB/s, hidden {r['hidden_share']:.0%} | "
                  f"kernels {r['kernel_vs_copy']:.2f} x copy_")
        if "replay" in case:
            r = case["replay"]
            print(f"  replay sync {r['replay_ttft_s'] * 1e3:8.1f} ms (x{r['ratio']:.1f}), "
                  f"top1 equal {r['top1_equal']}")
    for line in out["skipped"]:
        print("skipped:", line)
    for line in out["failures"]:
        print("FAILED:", line)
