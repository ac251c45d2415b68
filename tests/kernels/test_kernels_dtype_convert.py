"""The CUDA kernels' scalar conversions (hybrid_connector/kernels/dtype_convert.cuh), compiled for the
host, must round exactly like torch: this is what makes the CUDA and torch paths
bit-identical, including the fp8 path."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

KERNEL_DIR = Path(__file__).resolve().parents[2] / "hybrid_connector" / "kernels"

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "dtype_convert.cuh"
int main(int argc, char** argv) {
  FILE* f = std::fopen(argv[1], "rb");
  std::vector<float> x(std::atol(argv[2]));
  if (std::fread(x.data(), 4, x.size(), f) != x.size()) return 2;
  std::fclose(f);
  FILE* o = std::fopen(argv[3], "wb");
  for (float v : x) {
    unsigned short b = hc_f32_to_bf16(v), h = hc_f32_to_f16(v);
    unsigned char q = hc_f32_to_e4m3(v);
    std::fwrite(&b, 2, 1, o); std::fwrite(&h, 2, 1, o); std::fwrite(&q, 1, 1, o);
  }
  for (unsigned c = 0; c < 65536; ++c) {
    float b = hc_bf16_to_f32((unsigned short)c), h = hc_f16_to_f32((unsigned short)c);
    std::fwrite(&b, 4, 1, o); std::fwrite(&h, 4, 1, o);
  }
  for (unsigned c = 0; c < 256; ++c) {
    float q = hc_e4m3_to_f32((unsigned char)c);
    std::fwrite(&q, 4, 1, o);
  }
  std::fclose(o);
  return 0;
}
"""


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, size=200_000, dtype=np.uint64).astype(np.uint32)
    special = [0.0, -0.0, 1.0, -1.0, 448.0, 447.9, 464.0, 463.99, 65504.0, 65519.99, 65520.0,
               2.0**-24, 2.0**-25, 2.0**-25 * 1.0001, 2.0**-9, 2.0**-10, 2.0**-10 * 1.0001,
               2.0**-6, 2.0**-7 * 3, 1e-40, -1e-45, 3.4e38, np.inf, -np.inf, np.nan]
    # values near each representable e4m3 / f16 boundary, and a dense small-range sweep
    sweep = np.linspace(-500, 500, 100_001, dtype=np.float32)
    small = np.linspace(-0.02, 0.02, 50_001, dtype=np.float32)
    return np.concatenate([bits.view(np.float32), np.array(special, dtype=np.float32), sweep, small])


def _same_bits(ours: np.ndarray, theirs: np.ndarray, is_nan: np.ndarray) -> None:
    mismatch = (ours != theirs) & ~is_nan
    assert not mismatch.any(), f"{int(mismatch.sum())} mismatches, first at {np.argmax(mismatch)}"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, bytes]:
    compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the conversion harness")
    d = tmp_path_factory.mktemp("convert")
    (d / "h.cpp").write_text(HARNESS)
    exe = d / "h"
    subprocess.run([compiler, "-O2", "-std=c++17", f"-I{KERNEL_DIR}", str(d / "h.cpp"), "-o", str(exe)], check=True)
    x = _inputs()
    (d / "in.bin").write_bytes(x.tobytes())
    subprocess.run([str(exe), str(d / "in.bin"), str(x.size), str(d / "out.bin")], check=True)
    return x, (d / "out.bin").read_bytes()


def test_encoders_match_torch(converted: tuple[np.ndarray, bytes]) -> None:
    x, raw = converted
    n = x.size
    rec = np.frombuffer(raw[: n * 5], dtype=np.dtype([("bf", "<u2"), ("h", "<u2"), ("q", "u1")]))
    t = torch.from_numpy(x.copy())
    nan = np.isnan(x)
    _same_bits(rec["bf"], t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16), nan)
    _same_bits(rec["h"], t.to(torch.float16).view(torch.int16).numpy().view(np.uint16), nan)
    clamped = t.clamp(-448.0, 448.0)  # the kernels clamp before the e4m3 cast, as torch's path does
    _same_bits(rec["q"], clamped.to(torch.float8_e4m3fn).view(torch.uint8).numpy(), nan)
    assert (rec["q"][nan] & 0x7F == 0x7F).all() and (rec["bf"][nan] & 0x7FC0 == 0x7FC0).all()


def test_decoders_match_torch(converted: tuple[np.ndarray, bytes]) -> None:
    x, raw = converted
    tail = np.frombuffer(raw[x.size * 5 :], dtype="<f4")
    pairs, q = tail[: 65536 * 2].reshape(65536, 2), tail[65536 * 2 :]
    codes16 = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    want_bf = codes16.view(torch.bfloat16).float().numpy()
    want_h = codes16.view(torch.float16).float().numpy()
    want_q = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    for ours, want in ((pairs[:, 0], want_bf), (pairs[:, 1], want_h), (q, want_q)):
        nan = np.isnan(want)
        assert (np.isnan(ours) == nan).all()
        _same_bits(ours.view(np.uint32), want.view(np.uint32), nan)
