"""How much of a layer-wise load hides under the forward pass (CopyEngine on CUDA).

A hybrid stack of 32 layers, [GDN, GDN, GDN, attention] x 8 (Qwen3.5 / Qwen3-Next
style), restores a cached prefix while the suffix is prefilled:

* attention layer: the KV chunk of a ``--prefix``-token prefix (``--kv-heads`` x
  ``--head-size``, bf16) sits in pinned host memory; it lands in a device staging
  buffer and a ``post`` hook scatters it into the layer's paged KV cache
  (``kernels.scatter_kv_blocks``) on the copy stream;
* GDN layer: its state page (conv [3, 8192] bf16 | SSM [32, 128, 128] fp32, one
  contiguous page as in vLLM's Mamba layout) lands straight in the layer's slot.

Compute per layer is an MLP-sized pair of bf16 matmuls over ``--suffix`` tokens. Each
layer's compute waits on its own layer (``job.wait``), exactly what an integration
does. Reported: compute alone, load alone, both overlapped, and
``hidden = (compute + load - overlapped) / load`` (1.0 = the whole fetch was hidden).
The restored caches are checked against the host copy after the overlapped run.

    python3 benchmarks/gpu/bench_overlap.py [--quick]
    python benchmarks/gpu/bench_overlap.py --cpu-dry-run
        (= --device cpu --prefix 256 --hidden 64 --suffix 64 --quick: a smoke run of the same
        code on a machine without a GPU; the figures mean nothing)

``--json PATH`` also writes the figures as JSON (run_all.sh's summary reads it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hybrid_connector import kernels  # noqa: E402
from hybrid_connector.tiers.copy_engine import CopyEngine, LayerTransfer  # noqa: E402

DEV = torch.device("cuda")


def _pin(t: torch.Tensor) -> torch.Tensor:
    return t.pin_memory() if DEV.type == "cuda" else t


def _sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


class Stack:
    def __init__(self, prefix: int, kv_heads: int, head_size: int, hidden: int, suffix: int) -> None:
        self.kinds = ["gdn", "gdn", "gdn", "attn"] * 8
        bs = 16
        self.n_blocks = prefix // bs
        self.block_ids = torch.arange(1, 2 * self.n_blocks, 2)  # scattered destination blocks
        g = torch.Generator().manual_seed(0)
        self.host: list[torch.Tensor] = []
        self.staging: list[torch.Tensor] = []
        self.caches: list[list[torch.Tensor]] = []
        for kind in self.kinds:
            if kind == "attn":
                shape = (2, self.n_blocks, bs, kv_heads, head_size)
                data = torch.randint(-100, 100, shape, generator=g).to(torch.bfloat16)
                self.host.append(_pin(data))
                self.staging.append(torch.empty(shape, dtype=torch.bfloat16, device=DEV))
                self.caches.append([torch.zeros(2, 2 * self.n_blocks + 1, bs, kv_heads, head_size,
                                                dtype=torch.bfloat16, device=DEV)])
            else:
                conv_bytes, ssm_bytes = 3 * 8192 * 2, 32 * 128 * 128 * 4
                page = torch.randint(0, 256, (conv_bytes + ssm_bytes,), generator=g, dtype=torch.uint8)
                self.host.append(_pin(page))
                pool = torch.zeros(8, conv_bytes + ssm_bytes, dtype=torch.uint8, device=DEV)
                self.staging.append(pool[5])  # the slot's page itself
                self.caches.append([pool[:, :conv_bytes].view(torch.bfloat16).view(8, 3, 8192),
                                    pool[:, conv_bytes:].view(torch.float32).view(8, 32, 128, 128)])
        self.load_bytes = sum(h.numel() * h.element_size() for h in self.host)
        self.x = torch.randn(suffix, hidden, device=DEV, dtype=torch.bfloat16)
        self.w1 = torch.randn(hidden, 4 * hidden, device=DEV, dtype=torch.bfloat16) / hidden**0.5
        self.w2 = torch.randn(4 * hidden, hidden, device=DEV, dtype=torch.bfloat16) / (4 * hidden) ** 0.5

    def transfers(self) -> list[LayerTransfer]:
        out = []
        for i, kind in enumerate(self.kinds):
            out.append(LayerTransfer(f"layer{i}", dst=self.staging[i], src=self.host[i], post=self._post(i, kind)))
        return out

    def _post(self, i: int, kind: str):  # type: ignore[no-untyped-def]
        if kind == "attn":
            return lambda landed: kernels.scatter_kv_blocks(self.caches[i][0], self.block_ids, landed)
        return None  # the page landed in place

    def layer(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(x @ self.w1) @ self.w2

    def check(self) -> None:
        for i, kind in enumerate(self.kinds):
            if kind == "attn":
                got = kernels.gather_kv_blocks(self.caches[i][0], self.block_ids)
                assert torch.equal(got.cpu(), self.host[i]), f"layer {i}: KV mismatch"
            else:
                conv, ssm = self.caches[i]
                got = torch.cat([conv[5].reshape(-1).view(torch.uint8), ssm[5].reshape(-1).view(torch.uint8)])
                assert torch.equal(got.cpu(), self.host[i]), f"layer {i}: state mismatch"

    def clear(self) -> None:
        for cache in self.caches:
            for t in cache:
                t.zero_()


def wall(fn) -> float:  # type: ignore[no-untyped-def]
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t0


def h2d_bandwidth() -> float:
    host = _pin(torch.empty(1 << (28 if DEV.type == "cuda" else 20), dtype=torch.uint8))
    dev = torch.empty_like(host, device=DEV)
    return host.numel() / min(wall(lambda: dev.copy_(host, non_blocking=True)) for _ in range(5))


def run_config(engine: CopyEngine, stack: Stack, reps: int) -> dict[str, float]:
    def compute_only() -> None:
        x = stack.x
        for _ in stack.kinds:
            x = stack.layer(x)

    def load_only() -> None:
        job = engine.submit_layers(stack.transfers())
        for name in job.names:
            job.wait(name)

    def overlapped() -> None:
        job = engine.submit_layers(stack.transfers())
        x = stack.x
        for name in job.names:
            job.wait(name)  # the compute stream waits for this layer's data only
            x = stack.layer(x)

    for fn in (compute_only, load_only, overlapped):
        fn()
    res: dict[str, list[float]] = {"compute": [], "load": [], "overlap": []}
    for _ in range(reps):
        res["compute"].append(wall(compute_only))
        res["load"].append(wall(load_only))
        stack.clear()
        res["overlap"].append(wall(overlapped))
    stack.check()  # every layer landed intact under overlap
    return {k: statistics.median(v) for k, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--prefix", type=int, default=16384)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-size", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=2560)
    ap.add_argument("--suffix", type=int, nargs="+", default=[4096, 1024])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="--device cpu --prefix 256 --hidden 64 --suffix 64 --quick")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    if args.cpu_dry_run:
        args.device, args.prefix, args.hidden, args.suffix, args.quick = "cpu", 256, 64, [64], True
    global DEV
    DEV = torch.device(args.device)
    reps = 1 if args.cpu_dry_run else 3 if args.quick else 7
    if DEV.type == "cpu":
        torch.set_num_threads(1)  # tiny CPU tensors: threads only contend
    backend = kernels.backend_name(torch.empty(0, device=DEV))
    name = torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu"
    print(f"device {name} | kernel backend {backend}")
    h2d = h2d_bandwidth()
    print(f"host->device copy (pinned on CUDA): {h2d / 1e9:.1f} GB/s")
    results: list[dict[str, float]] = []
    with CopyEngine(max_workers=2, device=DEV) as engine:
        for suffix in args.suffix:
            stack = Stack(args.prefix, args.kv_heads, args.head_size, args.hidden, suffix)
            r = run_config(engine, stack, reps)
            hidden = max(0.0, min(1.0, (r["compute"] + r["load"] - r["overlap"]) / r["load"]))
            print(
                f"8 attn + 24 GDN layers, prefix {args.prefix} tok ({stack.load_bytes / 2**20:.0f} MiB to load), "
                f"suffix {suffix} tok: compute {r['compute'] * 1e3:.2f} ms | load {r['load'] * 1e3:.2f} ms "
                f"({stack.load_bytes / r['load'] / 1e9:.1f} GB/s) | overlapped {r['overlap'] * 1e3:.2f} ms | "
                f"fetch hidden {hidden:.0%} (target >= 80%; bound {min(1.0, r['compute'] / r['load']):.0%} "
                f"when compute < load)"
            )
            results.append({"suffix": suffix, "prefix": args.prefix, "load_bytes": stack.load_bytes,
                            "compute_s": r["compute"], "load_s": r["load"], "overlap_s": r["overlap"],
                            "hidden_share": hidden})
            stack.clear()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"device": name, "backend": backend,
                                               "h2d_GBps": h2d / 1e9, "cases": results}, indent=1))


if __name__ == "__main__":
    main()
