"""Plain-python reference implementations the kernel tests compare against.

Deliberately naive: per-element loops and an e4m3 rounding rule derived from the
table of all 256 codes, so they share no code with the implementations under test.
"""

from __future__ import annotations

import math
import struct

import torch


def f32(x: float) -> float:
    """Round a python float to the nearest float32."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _e4m3_table() -> list[tuple[float, int]]:
    values = []
    for code in range(0x7F):  # 0x7F is NaN; negatives by symmetry
        e, m = code >> 3, code & 7
        v = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        values.append((v, code))
    return values


E4M3 = _e4m3_table()


def e4m3_code(x: float) -> int:
    """Nearest e4m3fn code to float x (ties to even code), saturating at 448."""
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = min(abs(x), 448.0)
    best = min(E4M3, key=lambda vc: (abs(vc[0] - a), vc[1] & 1))
    return sign | best[1]


def e4m3_value(code: int) -> float:
    v = E4M3[code & 0x7F][0]
    return -v if code & 0x80 else v


def ref_pack(hidden: torch.Tensor, positions: list[int], dtype: torch.dtype) -> tuple[torch.Tensor, list[float] | None]:
    """Row-by-row gather; fp8 rows quantised with float32 scale and reciprocal."""
    rows = [[float(v) for v in hidden[p].tolist()] for p in positions]
    if dtype != torch.float8_e4m3fn:
        out = torch.tensor(rows, dtype=torch.float64).reshape(len(positions), hidden.shape[1])
        return out.to(dtype), None
    codes, scales = [], []
    for row in rows:
        amax = max((abs(v) for v in row), default=0.0)
        scale = f32(amax / 448.0) if amax > 0 else 1.0
        scales.append(scale)
        inv = f32(1.0 / scale)
        codes.append([e4m3_code(f32(v * inv)) for v in row])
    data = torch.tensor(codes, dtype=torch.uint8).reshape(len(positions), hidden.shape[1])
    return data.view(torch.float8_e4m3fn), scales


def ref_kv_gather(cache: torch.Tensor, ids: list[int], layout: str) -> torch.Tensor:
    kv_first = layout == "flash_attn"
    nb_axis = 1 if kv_first else 0
    _, _, bs, h, d = (2, cache.shape[nb_axis], *cache.shape[2:])
    out = torch.empty((2, len(ids), bs, h, d), dtype=cache.dtype)
    for k in range(2):
        for i, b in enumerate(ids):
            for t in range(bs):
                for hh in range(h):
                    src = cache[k, b, t, hh] if kv_first else cache[b, k, t, hh]
                    out[k, i, t, hh] = src
    return out


def ref_kv_scatter(cache: torch.Tensor, ids: list[int], buf: torch.Tensor, layout: str) -> torch.Tensor:
    out = cache.clone()
    for k in range(2):
        for i, b in enumerate(ids):
            for t in range(buf.shape[2]):
                for hh in range(buf.shape[3]):
                    if layout == "flash_attn":
                        out[k, b, t, hh] = buf[k, i, t, hh]
                    else:
                        out[b, k, t, hh] = buf[k, i, t, hh]
    return out
