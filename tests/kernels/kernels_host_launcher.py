"""Runs the real ``hybrid_connector/kernels/*.cu`` sources on the CPU, for tests without a GPU.

Each ``.cu`` file is compiled by a host C++ compiler behind a small shim that maps
``__global__``/``__device__`` away, ``blockIdx``/``threadIdx`` to variables and
``__syncthreads()`` to a ``std::barrier``. A launch walks the grid block by block; a
kernel that synchronises gets one OS thread per CUDA thread (so its barriers and
shared memory behave as on a GPU), the others run their threads one after another,
which is exact for kernels whose threads never communicate. The Python wrappers'
argument lists (raw addresses, byte strides, index pointers) go through unchanged,
so this checks the marshalling and the index arithmetic of the CUDA path, though not
GPU memory-model effects.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

KERNEL_DIR = Path(__file__).resolve().parents[2] / "hybrid_connector" / "kernels"

SHIM = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>
struct hc_dim3 { unsigned int x = 0, y = 1, z = 1; };
static hc_dim3 blockIdx, gridDim, blockDim;
static thread_local hc_dim3 threadIdx;
static std::barrier<>* hc_bar = nullptr;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __syncthreads() hc_bar->arrive_and_wait()
struct uint4 { unsigned int x, y, z, w; };
"""

_SIG = re.compile(r'extern "C" __global__ void (\w+)\(([^)]*)\)')
_MACRO_SIG = re.compile(r"#define (HC_\w+)\(NAME[^)]*\)[^\n]*\n\s*extern \"C\" __global__ void NAME\(([^)]*)\)", re.S)
_MACRO_USE = re.compile(r"^(HC_\w+)\((\w+)(?:, [\w ]+)*\)$", re.M)


def _entry_points(src: str) -> dict[str, int]:
    """Kernel name -> parameter count, including kernels stamped out by a macro."""
    out = {name: len(params.split(",")) for name, params in _SIG.findall(src) if name != "NAME"}
    macros = {m: len(re.sub(r"\\\s*\n", " ", params).split(",")) for m, params in _MACRO_SIG.findall(src)}
    for macro, name in _MACRO_USE.findall(src):
        if macro in macros:
            out[name] = macros[macro]
    return out


def _trampolines(kernels: dict[str, int], threaded: bool) -> str:
    code = []
    for name, n in kernels.items():
        args = ", ".join(f"a[{i}]" for i in range(n))
        if threaded:
            body = (
                "std::barrier<> bar(bx); hc_bar = &bar; std::vector<std::thread> ts;"
                f" for (unsigned t = 0; t < bx; ++t) ts.emplace_back([=] {{ threadIdx.x = t; {name}({args}); }});"
                " for (auto& th : ts) th.join();"
            )
        else:
            body = f"for (unsigned t = 0; t < bx; ++t) {{ threadIdx.x = t; {name}({args}); }}"
        code.append(
            f'extern "C" void host_{name}(unsigned gx, unsigned bx, const unsigned long long* a) {{'
            f" gridDim.x = gx; blockDim.x = bx;"
            f" for (unsigned b = 0; b < gx; ++b) {{ blockIdx.x = b; {body} }} }}"
        )
    return "\n".join(code)


class HostLauncher:
    """A ``hybrid_connector.kernels._launch.Launcher`` that executes the CUDA C sources on the host."""

    name = "host"

    def __init__(self) -> None:
        compiler = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
        if compiler is None:
            raise RuntimeError("no C++ compiler")
        self._compiler = compiler
        self._dir = Path(tempfile.mkdtemp(prefix="hc_host_kernels_"))
        self._libs: dict[str, ctypes.CDLL] = {}
        self._arity: dict[str, int] = {}
        self.launches: list[tuple[str, int, int]] = []

    def _lib(self, module: str) -> ctypes.CDLL:
        if module not in self._libs:
            src = (KERNEL_DIR / f"{module}.cu").read_text()
            entry = _entry_points(src)
            assert entry, f"no kernels found in {module}.cu"
            self._arity.update(entry)
            unit = self._dir / f"{module}.cpp"
            unit.write_text(SHIM + f'#include "{module}.cu"\n' + _trampolines(entry, "__syncthreads" in src))
            lib = self._dir / f"{module}.so"
            subprocess.run(
                [self._compiler, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-x", "c++",
                 f"-I{KERNEL_DIR}", str(unit), "-o", str(lib)],
                check=True,
            )
            self._libs[module] = ctypes.CDLL(str(lib))
        return self._libs[module]

    def launch(self, module: str, kernel: str, grid: int, block: int, args: Sequence[tuple[str, int]], device: torch.device) -> None:
        assert grid >= 1 and 32 <= block <= 1024 and block & (block - 1) == 0, (grid, block)
        fn = getattr(self._lib(module), f"host_{kernel}")
        assert len(args) == self._arity[kernel], f"{kernel} takes {self._arity[kernel]} args, got {len(args)}"
        values = (ctypes.c_ulonglong * len(args))(*[v & (2**64 - 1) for _, v in args])
        fn(ctypes.c_uint(grid), ctypes.c_uint(block), values)
        self.launches.append((kernel, grid, block))
