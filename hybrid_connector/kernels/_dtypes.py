"""Dtype codes shared with ``dtype_convert.cuh`` (keep the numbers in sync)."""

from __future__ import annotations

import torch

F32, F16, BF16, E4M3 = 0, 1, 2, 3

_CODES = {
    torch.float32: F32,
    torch.float16: F16,
    torch.bfloat16: BF16,
    torch.float8_e4m3fn: E4M3,
}

#: Largest finite float8 e4m3fn value; fp8 packing maps each row's amax onto it.
E4M3_MAX = 448.0


def code(dtype: torch.dtype) -> int:
    """Return the kernel code of ``dtype``; ``ValueError`` for unsupported dtypes."""
    try:
        return _CODES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} is not supported by the kernels") from None
