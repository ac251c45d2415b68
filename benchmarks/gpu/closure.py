"""Which distributions the GPU run imports that the GPU machine does not have (wheels.sh's
check of ``wheels.txt``). Run in the project's venv:

    python benchmarks/gpu/closure.py [wheels.txt]

Runs every step's code path in-process at the dry run's tiny sizes (bench_hf_ttft,
bench_kernels_gpu, bench_overlap with ``--cpu-dry-run``, pytest's collection of
tests/kernels, gpu_env's import list), so imports made lazily at run time count too; maps
every loaded top-level module to its distribution; drops the GPU machine's packages
(``GPU_MACHINE``), what importing them loads and everything they require (transitively, as
installed here); prints the rest. Exit 1 when one of them is missing from ``wheels.txt``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata as md
import io
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# What the H200 machine has (issue 28): python3.12 with these.
GPU_MACHINE = ("torch", "transformers", "cupy-cuda13x", "triton", "numpy", "pyyaml", "aiofiles",
               "xxhash", "sortedcontainers", "uvloop", "prometheus-client", "tqdm", "matplotlib")
GPU_IMPORTS = ("torch", "transformers", "triton", "numpy", "yaml", "aiofiles", "xxhash",
               "sortedcontainers", "uvloop", "prometheus_client", "tqdm", "matplotlib")
PROJECT = {"hybrid-connector"}
# Loaded here only because they are installed here: pytest loads every installed plugin
# (hypothesis; platformdirs >= 4.14 ships one); transformers imports psutil and sentencepiece
# only when they are available.
INCIDENTAL = {"hypothesis", "platformdirs", "psutil", "sentencepiece"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def provided() -> set[str]:
    """The GPU machine's distributions and their installed requirements, transitively."""
    seen: set[str] = set()
    todo = [_norm(n) for n in GPU_MACHINE]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for r in reqs:
            if "extra ==" in r:
                continue
            m = re.match(r"[A-Za-z0-9_.\-]+", r)
            if m:
                todo.append(_norm(m.group(0)))
    return seen


def run_steps() -> None:
    sys.path[:0] = [str(HERE), str(ROOT)]
    import bench_hf_ttft
    import bench_kernels_gpu
    import bench_overlap
    import gpu_env
    import pytest

    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        bench_hf_ttft.main(["--cpu-dry-run", "--out", f"{tmp}/hf.json"])
        for mod in (bench_kernels_gpu, bench_overlap):
            sys.argv = ["x", "--cpu-dry-run"]
            mod.main()
        pytest.main(["-q", "-p", "no:cacheprovider", "--collect-only", str(ROOT / "tests/kernels")])
        for name in (*gpu_env.THIRD_PARTY, *gpu_env.PROJECT):
            importlib.import_module(name)


def main(argv: list[str]) -> int:
    wanted_file = Path(argv[0]) if argv else HERE / "wheels.txt"
    owners = md.packages_distributions()

    def loaded() -> set[str]:
        return {_norm(d) for m in list(sys.modules) for d in owners.get(m.split(".")[0], [])}
    for name in GPU_IMPORTS:  # what the machine's own packages import comes with them
        importlib.import_module(name)
    baseline = loaded()
    run_steps()
    used = loaded()
    need = sorted(used - baseline - provided() - PROJECT - INCIDENTAL)
    listed = {_norm(line.split("==")[0]) for line in wanted_file.read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    missing = [n for n in need if n not in listed]
    print("imported by the steps, not on the GPU machine:", " ".join(need))
    print("also in wheels.txt, imported by the steps but maybe brought by the machine's packages:",
          " ".join(sorted((listed & used) - set(need))) or "-")
    print("also in wheels.txt, not imported by the steps (requirements of shipped ones):",
          " ".join(sorted(listed - used)) or "-")
    if missing:
        print("MISSING from wheels.txt:", " ".join(missing))
        return 1
    print("wheels.txt covers the closure")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
