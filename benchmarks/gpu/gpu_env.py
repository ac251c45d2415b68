"""The GPU machine's Python environment: carried wheels and the import check (stdlib only
until the check itself, so it runs before anything is installed).

    python3 benchmarks/gpu/gpu_env.py install WHEEL_DIR SITE_DIR
        unpacks every ``*.whl`` of WHEEL_DIR into SITE_DIR when they all fit this interpreter
        (a set with a wheel for another CPython is left alone: the dry run here after
        wheels.sh). A wheel is a zip whose root is importable as is; a
        ``*.data/purelib|platlib`` folder is merged into the root. The caller puts
        SITE_DIR first on PYTHONPATH. No pip and no index are needed (the GPU
        machine reaches none), and nothing outside SITE_DIR changes.
    python3 benchmarks/gpu/gpu_env.py check [--gpu]
        imports what run_all.sh's steps import (the transformers runtime, the tiers, the
        kernels, pytest; ``--gpu``: torch with CUDA and CuPy too) and prints their versions;
        exit 1 naming each module that does not import.

Which wheels: ``wheels.sh`` (the closure of these imports less what the GPU machine has).
"""

from __future__ import annotations

import importlib
import shutil
import sys
import zipfile
from pathlib import Path

# What the steps import: the project's modules (from the checkout) and the third-party
# packages behind them that the GPU machine may lack (wheels.sh ships those).
PROJECT = ("hybrid_connector.integrations.hf.runtime", "hybrid_connector.integrations.hf.state",
           "hybrid_connector.tiers.manager", "hybrid_connector.tiers.device",
           "hybrid_connector.tiers.host", "hybrid_connector.tiers.nvme",
           "hybrid_connector.tiers.copy_engine", "hybrid_connector.kernels")
THIRD_PARTY = ("torch", "transformers", "numpy", "yaml", "pydantic", "pydantic_core", "blake3",
               "zstandard", "msgspec", "xxhash", "sortedcontainers", "aiofiles", "tqdm", "pytest",
               "pytest_timeout")


def fits(whl: Path) -> bool:
    """Whether this interpreter can import ``whl`` (its file name's python and ABI tags): a
    ``cp312`` wheel unpacked for another CPython would shadow a working install with a
    binary that cannot load (the dry run here, after wheels.sh filled .whl for the GPU)."""
    parts = whl.name[:-4].split("-")
    py_tag, abi_tag = parts[-3], parts[-2]
    here = sys.version_info.major * 100 + sys.version_info.minor
    for tag in py_tag.split("."):
        if tag.startswith("py"):
            return True
        if tag.startswith("cp"):
            want = int(tag[2]) * 100 + int(tag[3:] or 0)
            if abi_tag == "abi3" and here >= want:
                return True
            if abi_tag != "abi3" and here == want:
                return True
    return False


def install(wheel_dir: Path, site: Path) -> int:
    wheels = sorted(wheel_dir.glob("*.whl"))
    misfits = [w.name for w in wheels if not fits(w)]
    if misfits:  # the set is for another Python: unpacking part of it would mix versions
        print(f"gpu_env: {wheel_dir} is not for python {sys.version.split()[0]} "
              f"({', '.join(misfits)}); nothing unpacked")
        return 0
    site.mkdir(parents=True, exist_ok=True)
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)
        for data in site.glob("*.data"):
            for sub in ("purelib", "platlib"):
                src = data / sub
                if src.is_dir():
                    for item in src.iterdir():
                        dst = site / item.name
                        if dst.exists():
                            shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
                        shutil.move(str(item), str(dst))
            shutil.rmtree(data)
    print(f"gpu_env: {len(wheels)} wheels from {wheel_dir} unpacked into {site}")
    return 0


def check(gpu: bool) -> int:
    bad: list[str] = []
    for name in (*THIRD_PARTY, *PROJECT, *(("cupy",) if gpu else ())):
        try:
            mod = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - report every module that fails
            bad.append(f"{name}: {exc!r}")
            continue
        if name in THIRD_PARTY or name == "cupy":
            print(f"{name} {getattr(mod, '__version__', '?')} ({Path(mod.__file__ or '?').parent})")
    if gpu:
        import torch

        if not torch.cuda.is_available():
            bad.append("torch: no CUDA device visible")
    for line in bad:
        print("gpu_env: cannot import", line)
    print(f"python {sys.version.split()[0]}: {'OK' if not bad else f'{len(bad)} missing'}")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "install":
        return install(Path(argv[1]), Path(argv[2]))
    if argv and argv[0] == "check":
        return check("--gpu" in argv[1:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
