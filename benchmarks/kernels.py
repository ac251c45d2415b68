"""CPU throughput of the kernels' torch fallbacks against plain torch baselines.

Each row times one ``kernels`` call and, in the same run on the same machine, a
baseline that moves the same payload bytes: ``torch.index_select`` of as many rows
(for gathers) or a plain ``Tensor.copy_`` of a dense tensor of the same size.
``ratio`` = baseline time / kernel time (1.0 = as fast as the baseline; > 1 faster).
Times are the best of ``--reps`` runs after a warm-up, kernel and baseline
alternating (the machine may be shared). ``payload`` counts bytes
written to the destination.

    .venv/bin/python benchmarks/kernels.py [--quick] [--reps N] [--threads N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hybrid_connector import kernels  # noqa: E402


@dataclass
class Row:
    name: str
    payload: int
    t_kernel: float
    baseline: str
    t_base: float

    @property
    def ratio(self) -> float:
        return self.t_base / self.t_kernel


def best_times(fns: list[Callable[[], object]], reps: int, device: torch.device) -> list[float]:
    """Best time of each function, alternating between them every repetition so that
    load from other processes hits the kernel and its baseline alike."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best = [float("inf")] * len(fns)
    for fn in fns:
        fn()
    sync()
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            sync()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def copy_baseline(nbytes: int, device: torch.device) -> tuple[Callable[[], object], str]:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), "copy_"


def select_baseline(rows: int, row_elems: int, total_rows: int, dtype: torch.dtype, device: torch.device) -> tuple[Callable[[], object], str]:
    src = torch.randn(total_rows, row_elems, device=device).to(dtype)
    idx = torch.randperm(total_rows, device=device)[:rows]
    out = torch.empty(rows, row_elems, dtype=dtype, device=device)
    return (lambda: torch.index_select(src, 0, idx, out=out)), "index_select"


def run(quick: bool, reps: int, device: torch.device) -> list[Row]:
    scale = 4 if quick else 1
    g = torch.Generator().manual_seed(0)
    rows: list[Row] = []

    def add(name: str, fn: Callable[[], object], payload: int, base: tuple[Callable[[], object], str]) -> None:
        t_k, t_b = best_times([fn, base[0]], reps, device)
        rows.append(Row(name, payload, t_k, base[1], t_b))

    # ---- anchors: sparse rows of a [tokens, hidden] bf16 activation
    tokens, hidden, n = 8192 // scale, 4096, 1024 // scale
    h = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).to(device)
    pos = sorted(torch.randperm(tokens, generator=g)[:n].tolist())
    sel = select_baseline(n, hidden, tokens, torch.bfloat16, device)
    row_bytes = hidden * 2
    out = torch.empty(n, hidden, dtype=torch.bfloat16, device=device)
    add("anchor pack bf16", lambda: kernels.pack_anchors(h, pos, out=out), n * row_bytes, sel)
    fp8_out = torch.empty(n, hidden, dtype=torch.float8_e4m3fn, device=device)
    scale_out = torch.empty(n, device=device)
    add(
        "anchor pack bf16->fp8",
        lambda: kernels.pack_anchors(h, pos, dtype=torch.float8_e4m3fn, out=fp8_out, scale_out=scale_out),
        n * hidden + 4 * n,
        sel,
    )
    packed = kernels.pack_anchors(h, pos, dtype=torch.float8_e4m3fn)
    dst = torch.zeros_like(h)
    add("anchor unpack fp8->bf16", lambda: kernels.unpack_anchors(packed, dst, pos), n * row_bytes, sel)
    add("anchor unpack bf16", lambda: kernels.unpack_anchors(out, dst, pos), n * row_bytes, sel)

    # ---- paged KV: one attention layer, a chunk of blocks, both vLLM layouts
    nb, bs, heads, hd = 2048 // scale, 16, 8, 128
    n_blk = 256 // scale
    ids = torch.randperm(nb, generator=g)[:n_blk].tolist()
    payload = 2 * n_blk * bs * heads * hd * 2
    copy = copy_baseline(payload, device)
    fa = torch.randn(2, nb, bs, heads, hd, generator=g).to(torch.bfloat16).to(device)
    fi_hnd = torch.randn(nb, 2, heads, bs, hd, generator=g).to(torch.bfloat16).to(device).permute(0, 1, 3, 2, 4)
    buf = torch.empty(2, n_blk, bs, heads, hd, dtype=torch.bfloat16, device=device)
    kv_sel = select_baseline(2 * n_blk, bs * heads * hd, 2 * nb, torch.bfloat16, device)
    add("kv gather flash_attn NHD", lambda: kernels.gather_kv_blocks(fa, ids, out=buf), payload, kv_sel)
    add("kv gather flash_attn NHD", lambda: kernels.gather_kv_blocks(fa, ids, out=buf), payload, copy)
    add("kv scatter flash_attn NHD", lambda: kernels.scatter_kv_blocks(fa, ids, buf), payload, copy)
    add(
        "kv gather flashinfer HND",
        lambda: kernels.gather_kv_blocks(fi_hnd, ids, layout="flashinfer", out=buf),
        payload,
        copy,
    )
    add(
        "kv scatter flashinfer HND",
        lambda: kernels.scatter_kv_blocks(fi_hnd, ids, buf, layout="flashinfer"),
        payload,
        copy,
    )

    # ---- recurrent state pages: GDN-sized conv + ssm state of a few layers
    slots, layers, n_pages = 48 // (2 if quick else 1), 3, 8
    conv = [torch.randn(slots, 3, 8192, generator=g).to(torch.bfloat16).to(device) for _ in range(layers)]
    ssm = [torch.randn(slots, 16, 128, 128, generator=g).to(device) for _ in range(layers)]
    states = conv + ssm
    src_slots, dst_slots = list(range(n_pages)), list(range(slots - n_pages, slots))
    page_bytes = sum(t[0].numel() * t.element_size() for t in states)
    add(
        "state pages (3 GDN layers)",
        lambda: kernels.copy_state_pages(states, states, src_slots, dst_slots),
        n_pages * page_bytes,
        copy_baseline(n_pages * page_bytes, device),
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller shapes, fewer repetitions")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (1 keeps ratios stable on a shared machine)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    reps = args.reps or (5 if args.quick else 15)
    t0 = time.perf_counter()
    rows = run(args.quick, reps, device)
    backend = kernels.backend_name(torch.empty(0, device=device))
    print(f"kernels fallback throughput on {device} (backend={backend}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, best of {reps})")
    print(f"{'kernel':30} {'payload MiB':>11} {'kernel GB/s':>11} {'baseline':>12} {'base GB/s':>9} {'ratio':>6}")
    for r in rows:
        print(
            f"{r.name:30} {r.payload / 2**20:11.2f} {r.payload / r.t_kernel / 1e9:11.2f} "
            f"{r.baseline:>12} {r.payload / r.t_base / 1e9:9.2f} {r.ratio:6.2f}"
        )
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
