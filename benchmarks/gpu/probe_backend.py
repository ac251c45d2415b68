"""Exit 0 if the kernel launcher chosen by HC_KERNEL_BACKEND compiles and runs every
kernel module on the GPU and matches the torch path on a tiny input; print why not
otherwise. run_all.sh uses it to fall back from CuPy to nvcc before the real tests.

    HC_KERNEL_BACKEND=cupy python3 benchmarks/gpu/probe_backend.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hybrid_connector import kernels  # noqa: E402


def main() -> int:
    dev = torch.device("cuda")
    h = torch.randn(8, 64, device=dev, dtype=torch.bfloat16)
    try:
        backend = kernels.backend_name(h)
    except Exception as exc:  # noqa: BLE001 - e.g. cupy not installed
        print(f"probe: launcher unavailable: {exc!r}")
        return 1
    if backend == "torch":
        print("probe: no kernel launcher available")
        return 1
    try:
        got = kernels.pack_anchors(h, [1, 5], dtype=torch.float8_e4m3fn)
        cache = torch.randn(2, 4, 16, 2, 64, device=dev, dtype=torch.bfloat16)
        buf = kernels.gather_kv_blocks(cache, [3, 0])
        states = torch.randn(4, 32, device=dev)
        kernels.copy_state_pages(states, states, [0], [2])
        torch.cuda.synchronize()
        with kernels.torch_only():
            want = kernels.pack_anchors(h, [1, 5], dtype=torch.float8_e4m3fn)
            want_buf = kernels.gather_kv_blocks(cache, [3, 0])
        ok = (
            torch.equal(got.data.view(torch.uint8), want.data.view(torch.uint8))
            and torch.equal(buf, want_buf)
            and torch.equal(states[2], states[0])
        )
    except Exception as exc:  # noqa: BLE001 - report any launcher failure
        print(f"probe: backend {backend} failed: {exc!r}")
        return 1
    print(f"probe: backend {backend} {'OK' if ok else 'gives WRONG results'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
