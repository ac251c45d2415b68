"""The installed package: ``hybrid_connector`` is the only top-level import name it puts into
``site-packages``, so it installs beside Hugging Face's ``kernels`` package (the kernel hub
transformers uses) and both import.

The test builds this project's wheel, installs it ``--no-deps`` into a fresh venv together
with ``kernels`` from the package index (skipped, saying so, when no index answers), and
lets the new venv see the development venv's ``site-packages`` for torch and the other
dependencies through a ``.pth`` line that comes after its own ``site-packages``: whatever
the new venv holds (our wheel, HF's ``kernels``) wins. A plain path line does not run the
development venv's own ``.pth`` files, so its editable install of this checkout stays out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HF_KERNELS = "kernels==0.17.2"  # Hugging Face's kernel hub; pure Python, installed --no-deps

PROBE = """
import json, kernels, hybrid_connector, hybrid_connector.kernels, hybrid_connector.tiers.manager
print(json.dumps({name: mod.__file__ for name, mod in [
    ("kernels", kernels), ("hybrid_connector", hybrid_connector),
    ("hybrid_connector.kernels", hybrid_connector.kernels),
    ("hybrid_connector.tiers.manager", hybrid_connector.tiers.manager)]}))
"""


def pip(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def record(site: Path, dist: str) -> list[str]:
    """The paths (relative to ``site``) one installed distribution wrote, from its RECORD."""
    (info,) = site.glob(f"{dist}-*.dist-info")
    return [line.split(",")[0] for line in (info / "RECORD").read_text().splitlines() if line]


def top_levels(paths: list[str]) -> set[str]:
    """The top-level import names among ``paths`` (scripts and metadata left out)."""
    return {p.split("/")[0].removesuffix(".py") for p in paths
            if not p.split("/")[0].endswith(".dist-info") and not p.startswith("..")}


def test_the_wheel_installs_beside_hugging_faces_kernels(tmp_path: Path) -> None:
    wheels, venv, src = tmp_path / "wheels", tmp_path / "venv", tmp_path / "src"
    # Built from a copy of what the wheel holds: setuptools builds in-tree (build/, *.egg-info),
    # and a stale build/lib in the checkout would put modules that no longer exist in the wheel.
    shutil.copytree(ROOT / "hybrid_connector", src / "hybrid_connector",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    built = pip("wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                cwd=tmp_path)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = wheels.glob("hybrid_connector-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    hf = pip("--python", str(python), "install", "--no-deps", "-q", "--timeout", "20",
             "--retries", "1", HF_KERNELS, cwd=tmp_path)  # offline: a skip within a minute
    if hf.returncode != 0:
        pytest.skip(f"pip could not install {HF_KERNELS} from a package index (offline?): "
                    f"{hf.stderr.strip().splitlines()[-1:]}")
    ours = pip("--python", str(python), "install", "--no-deps", "-q", str(wheel), cwd=tmp_path)
    assert ours.returncode == 0, ours.stdout[-2000:] + ours.stderr[-2000:]

    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    # torch, numpy, pydantic, ... from the development venv, searched after our own site
    (site / "zz_dev_site.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    assert top_levels(record(site, "hybrid_connector")) == {"hybrid_connector"}
    assert not (site / "tiers").exists()
    hf_files = record(site, "kernels")
    assert "kernels" in top_levels(hf_files)

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    probe = subprocess.run([str(python), "-c", PROBE], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-3000:]
    files = {name: Path(f).resolve() for name, f in json.loads(probe.stdout).items()}
    ours_dir = (site / "hybrid_connector").resolve()
    assert files["kernels"].relative_to(site.resolve()).as_posix() in hf_files  # HF's file
    assert files["hybrid_connector"].is_relative_to(ours_dir)  # the wheel, not this checkout
    assert files["hybrid_connector.kernels"].is_relative_to(ours_dir / "kernels")
    assert files["hybrid_connector.tiers.manager"] == ours_dir / "tiers" / "manager.py"
