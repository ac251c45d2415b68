"""GPU bandwidth of each kernel as a fraction of the device's measured copy bandwidth.

The reference is a device-to-device ``Tensor.copy_`` of 1 GiB timed in the same run.
Every figure counts memory traffic (bytes read + bytes written), so a kernel at 1.0
moves data as fast as the copy engine of the framework. Also printed: the torch
fallback on the same CUDA tensors, to show what the kernels buy. Target: >= 0.7.

    python3 benchmarks/gpu/bench_kernels_gpu.py [--quick]
    python benchmarks/gpu/bench_kernels_gpu.py --cpu-dry-run   (= --device cpu --shrink 256 --quick)
        (a smoke run of the same code without a GPU; the figures mean nothing)

``--json PATH`` also writes the figures as JSON (run_all.sh's summary reads it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hybrid_connector import kernels  # noqa: E402

DEV = torch.device("cuda")


SHRINK = 1  # divides every size (for smoke runs)


def timed(fn: Callable[[], object], iters: int, inner: int = 5) -> float:
    """Median seconds per call over ``iters`` samples of ``inner`` back-to-back calls,
    CUDA-event timed after warm-up. Host-side work (index checks, launches) counts
    whenever it is slower than the GPU work it feeds."""
    for _ in range(3):
        fn()
    if DEV.type != "cuda":
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times.append((time.perf_counter() - t0) / inner)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(times)


Bench = Callable[[str, int, Callable[[], object]], None]


def copy_bandwidth(iters: int) -> float:
    n = (1 << 30) // SHRINK
    a = torch.empty(n, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    return 2 * n / timed(lambda: b.copy_(a), iters)


def bench_anchors(bench: Bench, g: torch.Generator) -> None:
    """16k sparse rows of a 64k-token, 4096-wide bf16 activation."""
    tokens, hidden, n = 65536 // SHRINK, 4096, 16384 // SHRINK
    h = torch.randn(tokens, hidden, device=DEV, generator=g, dtype=torch.bfloat16)
    pos = torch.randperm(tokens)[:n].sort().values
    out = torch.empty(n, hidden, dtype=torch.bfloat16, device=DEV)
    q = torch.empty(n, hidden, dtype=torch.float8_e4m3fn, device=DEV)
    sc = torch.empty(n, device=DEV)
    dst = torch.empty_like(h)
    row = n * hidden
    bench("anchor pack bf16", 4 * row, lambda: kernels.pack_anchors(h, pos, out=out))
    bench("anchor pack bf16->fp8", 3 * row,
          lambda: kernels.pack_anchors(h, pos, dtype=torch.float8_e4m3fn, out=q, scale_out=sc))
    packed = kernels.pack_anchors(h, pos, dtype=torch.float8_e4m3fn)
    bench("anchor unpack fp8->bf16", 3 * row, lambda: kernels.unpack_anchors(packed, dst, pos))
    bench("anchor unpack bf16", 4 * row, lambda: kernels.unpack_anchors(out, dst, pos))


def bench_kv(bench: Bench, g: torch.Generator, layout: str) -> None:
    """One layer of 16k blocks (16 tokens x 8 heads x 128, bf16); a 4k-block chunk."""
    nb, bs, heads, hd, n_blk = 16384 // SHRINK, 16, 8, 128, 4096 // SHRINK
    ids = torch.randperm(nb)[:n_blk]
    traffic = 2 * (2 * n_blk * bs * heads * hd * 2)
    if layout == "flash_attn":  # NHD physical order
        cache = torch.randn(2, nb, bs, heads, hd, device=DEV, generator=g, dtype=torch.bfloat16)
        tag = "flash_attn NHD"
    else:  # HND physical order viewed in vLLM's logical shape
        cache = torch.randn(nb, 2, heads, bs, hd, device=DEV, generator=g, dtype=torch.bfloat16)
        cache = cache.permute(0, 1, 3, 2, 4)
        tag = "flashinfer HND"
    buf = torch.empty(2, n_blk, bs, heads, hd, device=DEV, dtype=torch.bfloat16)
    bench(f"kv gather {tag}", traffic, lambda: kernels.gather_kv_blocks(cache, ids, layout=layout, out=buf))
    bench(f"kv scatter {tag}", traffic, lambda: kernels.scatter_kv_blocks(cache, ids, buf, layout=layout))


def bench_states(bench: Bench, g: torch.Generator) -> None:
    """24 GDN layers: conv [3, 8192] bf16 + ssm [32, 128, 128] fp32 per slot, 16 pages."""
    cut = min(SHRINK, 8)
    slots, layers, n_pages = 48 // cut, 24 // cut, 16 // cut
    conv = [torch.randn(slots, 3, 8192, device=DEV, generator=g, dtype=torch.bfloat16) for _ in range(layers)]
    ssm = [torch.randn(slots, 32, 128, 128, device=DEV, generator=g) for _ in range(layers)]
    states = conv + ssm
    page_bytes = sum(t[0].numel() * t.element_size() for t in states)
    src_slots, dst_slots = list(range(n_pages)), list(range(slots - n_pages, slots))
    bench(f"state pages ({layers} GDN layers)", 2 * n_pages * page_bytes,
          lambda: kernels.copy_state_pages(states, states, src_slots, dst_slots))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shrink", type=int, default=1, help="divide sizes (smoke runs)")
    ap.add_argument("--cpu-dry-run", action="store_true", help="--device cpu --shrink 256 --quick")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    if args.cpu_dry_run:
        args.device, args.shrink, args.quick = "cpu", 256, True
    global DEV, SHRINK
    DEV, SHRINK = torch.device(args.device), max(1, args.shrink)
    iters = 2 if args.cpu_dry_run else 10 if args.quick else 30
    if DEV.type == "cpu":
        torch.set_num_threads(1)  # tiny CPU tensors: threads only contend
    g = torch.Generator(device=DEV).manual_seed(0)
    copy_bw = copy_bandwidth(iters)
    backend = kernels.backend_name(torch.empty(0, device=DEV))
    name = torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu"
    print(f"device {name} | kernel backend {backend}")
    print(f"reference: device-to-device copy_ of {1024 // SHRINK} MiB: {copy_bw / 1e12:.2f} TB/s (read + write)")

    rows: list[tuple[str, int, float, float]] = []

    def bench(name: str, traffic: int, fn: Callable[[], object]) -> None:
        t_kernel = timed(fn, iters)
        with kernels.torch_only():
            t_torch = timed(fn, iters)
        rows.append((name, traffic, t_kernel, t_torch))

    bench_anchors(bench, g)
    bench_kv(bench, g, "flash_attn")
    bench_kv(bench, g, "flashinfer")
    bench_states(bench, g)

    print(f"{'kernel':30} {'traffic MiB':>11} {'TB/s':>6} {'x copy_':>8} {'torch TB/s':>10} {'x copy_':>8}")
    worst = float("inf")
    for name, traffic, tk, tt in rows:
        frac = traffic / tk / copy_bw
        worst = min(worst, frac)
        print(f"{name:30} {traffic / 2**20:11.1f} {traffic / tk / 1e12:6.2f} {frac:8.2f} "
              f"{traffic / tt / 1e12:10.2f} {traffic / tt / copy_bw:8.2f}")
    print(f"lowest kernel fraction of copy bandwidth: {worst:.2f} (target >= 0.70)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "device": name, "backend": backend, "copy_TBps": copy_bw / 1e12,
            "lowest_fraction": worst,
            "kernels": [{"kernel": n, "traffic_bytes": tr, "TBps": tr / tk / 1e12,
                         "x_copy": tr / tk / copy_bw, "torch_x_copy": tr / tt / copy_bw}
                        for n, tr, tk, tt in rows]}, indent=1))


if __name__ == "__main__":
    main()
