"""Kernel launchers for CUDA tensors: CuPy first, an nvcc + driver-API fallback second.

Nothing here imports cupy (or touches CUDA) at module import time: a launcher is built
the first time a CUDA tensor reaches a kernel. ``HC_KERNEL_BACKEND`` chooses:

* ``auto`` (default): CuPy ``RawModule`` if ``import cupy`` works, else the ``cubin``
  launcher if ``nvcc`` is on PATH, else ``None`` (callers use the torch path).
* ``cupy`` / ``cubin``: that launcher or an error.
* ``torch``: never launch kernels (the torch path also runs on CUDA tensors).

Both launchers take arguments as ``(kind, value)`` pairs, ``"p"`` for a device address
and ``"i"`` for a 64-bit integer, which is how every ``.cu`` entry point is declared,
and run the kernel on the given stream handle (normally torch's current stream).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

KERNEL_DIR = Path(__file__).resolve().parent
Arg = tuple[str, int]


def ptr(t: torch.Tensor | None) -> Arg:
    """Device address of ``t`` (0 for ``None``, meaning 'no tensor')."""
    return ("p", 0 if t is None else int(t.data_ptr()))


def i64(v: int) -> Arg:
    """A 64-bit signed integer kernel argument."""
    return ("i", int(v))


class Launcher(Protocol):
    """Runs one ``extern "C"`` kernel of a ``hybrid_connector/kernels/<module>.cu`` file."""

    name: str

    def launch(
        self,
        module: str,
        kernel: str,
        grid: int,
        block: int,
        args: Sequence[Arg],
        device: torch.device,
    ) -> None: ...


def _source(module: str) -> str:
    return (KERNEL_DIR / f"{module}.cu").read_text()


class CupyLauncher:
    """Compiles the ``.cu`` sources with NVRTC through ``cupy.RawModule``."""

    name = "cupy"

    def __init__(self) -> None:
        import cupy  # noqa: PLC0415  (lazy by design: cupy is optional)
        import numpy

        self._cp: Any = cupy
        self._np: Any = numpy
        self._modules: dict[tuple[str, int], Any] = {}
        self._lock = threading.Lock()

    def _module(self, module: str, index: int) -> Any:
        key = (module, index)
        with self._lock:
            if key not in self._modules:
                with self._cp.cuda.Device(index):
                    self._modules[key] = self._cp.RawModule(
                        code=_source(module), options=("-std=c++17", f"-I{KERNEL_DIR}")
                    )
            return self._modules[key]

    def launch(
        self,
        module: str,
        kernel: str,
        grid: int,
        block: int,
        args: Sequence[Arg],
        device: torch.device,
    ) -> None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        fn = self._module(module, index).get_function(kernel)
        np = self._np
        packed = tuple(np.uint64(v) if kind == "p" else np.int64(v) for kind, v in args)
        stream = torch.cuda.current_stream(index).cuda_stream
        with self._cp.cuda.Device(index), self._cp.cuda.ExternalStream(stream):
            fn((grid,), (block,), packed)


class CubinLauncher:
    """Compiles the ``.cu`` sources with ``nvcc --cubin`` and launches through libcuda.

    Used where CuPy is not installed (for example a GPU box without internet). The
    cubins are cached under ``HC_KERNEL_CACHE`` (default ``~/.cache/hybrid_connector``)
    keyed by source hash and architecture.
    """

    name = "cubin"

    def __init__(self) -> None:
        nvcc = shutil.which("nvcc")
        if nvcc is None:
            raise RuntimeError("nvcc is not on PATH")
        self._nvcc = nvcc
        self._cuda = ctypes.CDLL("libcuda.so.1")
        self._check(self._cuda.cuInit(0), "cuInit")
        self._lock = threading.Lock()
        self._contexts: dict[int, ctypes.c_void_p] = {}
        self._functions: dict[tuple[str, str, int], ctypes.c_void_p] = {}
        self._modules: dict[tuple[str, int], ctypes.c_void_p] = {}
        cache = os.environ.get("HC_KERNEL_CACHE", "~/.cache/hybrid_connector/kernels")
        self._cache = Path(cache).expanduser()

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = ctypes.c_char_p()
            self._cuda.cuGetErrorString(rc, ctypes.byref(msg))
            text = msg.value.decode() if msg.value else "unknown error"
            raise RuntimeError(f"{what} failed with CUDA error {rc}: {text}")

    def _cubin(self, module: str, index: int) -> bytes:
        major, minor = torch.cuda.get_device_capability(index)
        arch = f"sm_{major}{minor}"
        src = KERNEL_DIR / f"{module}.cu"
        digest = hashlib.sha256(src.read_bytes() + (KERNEL_DIR / "dtype_convert.cuh").read_bytes())
        out = self._cache / f"{module}-{arch}-{digest.hexdigest()[:16]}.cubin"
        if not out.exists():
            self._cache.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(f".{os.getpid()}.tmp")
            cmd = [self._nvcc, f"-arch={arch}", "-O3", "--cubin", "-o", str(tmp), str(src)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"nvcc failed on {src.name} for {arch}:\n{done.stderr[-4000:]}")
            tmp.replace(out)  # atomic: concurrent processes never read half a file
        return out.read_bytes()

    def _context(self, index: int) -> ctypes.c_void_p:
        if index not in self._contexts:
            dev = ctypes.c_int()
            self._check(self._cuda.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
            ctx = ctypes.c_void_p()
            self._check(
                self._cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain"
            )
            self._contexts[index] = ctx
        return self._contexts[index]

    def _function(self, module: str, kernel: str, index: int) -> ctypes.c_void_p:
        key = (module, kernel, index)
        with self._lock:
            if key not in self._functions:
                mkey = (module, index)
                if mkey not in self._modules:
                    image = self._cubin(module, index)
                    mod = ctypes.c_void_p()
                    self._check(self._cuda.cuModuleLoadData(ctypes.byref(mod), image), "cuModuleLoadData")
                    self._modules[mkey] = mod
                fn = ctypes.c_void_p()
                self._check(
                    self._cuda.cuModuleGetFunction(ctypes.byref(fn), self._modules[mkey], kernel.encode()),
                    f"cuModuleGetFunction({kernel})",
                )
                self._functions[key] = fn
            return self._functions[key]

    def launch(
        self,
        module: str,
        kernel: str,
        grid: int,
        block: int,
        args: Sequence[Arg],
        device: torch.device,
    ) -> None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        stream = torch.cuda.current_stream(index).cuda_stream
        # torch reads its current device from the thread's current context, so the
        # primary context of ``index`` is made current only for the launch.
        prev = ctypes.c_void_p()
        self._check(self._cuda.cuCtxGetCurrent(ctypes.byref(prev)), "cuCtxGetCurrent")
        with self._lock:
            ctx = self._context(index)
        switch = prev.value != ctx.value
        if switch:
            self._check(self._cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        try:
            fn = self._function(module, kernel, index)
            values = [ctypes.c_uint64(v) if kind == "p" else ctypes.c_int64(v) for kind, v in args]
            params = (ctypes.c_void_p * len(values))(
                *[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values]
            )
            self._check(
                self._cuda.cuLaunchKernel(
                    fn, grid, 1, 1, block, 1, 1, 0, ctypes.c_void_p(stream), params, None
                ),
                f"cuLaunchKernel({kernel})",
            )
        finally:
            if switch:
                self._check(self._cuda.cuCtxSetCurrent(prev), "cuCtxSetCurrent")


_launcher: Launcher | None = None
_resolved = False
_resolve_lock = threading.Lock()


def cuda_launcher() -> Launcher | None:
    """The launcher CUDA tensors use, or ``None`` for the torch path (see module doc)."""
    global _launcher, _resolved
    with _resolve_lock:
        if _resolved:
            return _launcher
        choice = os.environ.get("HC_KERNEL_BACKEND", "auto").strip().lower()
        if choice not in ("auto", "cupy", "cubin", "torch"):
            raise ValueError(f"HC_KERNEL_BACKEND={choice!r}; expected auto, cupy, cubin or torch")
        launcher: Launcher | None = None
        if choice in ("auto", "cupy"):
            try:
                launcher = CupyLauncher()
            except ImportError:
                if choice == "cupy":
                    raise
        if launcher is None and choice in ("auto", "cubin"):
            try:
                launcher = CubinLauncher()
            except (OSError, RuntimeError):
                if choice == "cubin":
                    raise
        _launcher, _resolved = launcher, True
        return launcher


def reset_launcher() -> None:
    """Forget the chosen launcher so the next call re-reads ``HC_KERNEL_BACKEND``."""
    global _launcher, _resolved
    with _resolve_lock:
        _launcher, _resolved = None, False
