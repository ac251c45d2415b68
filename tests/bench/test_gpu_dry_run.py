"""benchmarks/gpu/run_all.sh --cpu-dry-run: every step of the one-shot GPU run (issue 28)
runs its code path on CPU at tiny sizes, so a broken import, argument or step is caught
without a GPU; and the run is time-bounded (a step past its timeout is cut, the summary
JSON is still written)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUN_ALL = ROOT / "benchmarks" / "gpu" / "run_all.sh"


def fake_wheel(folder: Path, tags: str = "py3-none-any") -> Path:
    """A tiny pure-python wheel, with a ``.data/purelib`` part, standing in for wheels.sh's."""
    folder.mkdir(parents=True, exist_ok=True)
    whl = folder / f"hc_dry_probe-0.1-{tags}.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("hc_dry_probe/__init__.py", "VALUE = 42\n")
        z.writestr("hc_dry_probe-0.1.data/purelib/hc_dry_probe_extra.py", "EXTRA = 1\n")
        z.writestr("hc_dry_probe-0.1.dist-info/METADATA",
                   "Metadata-Version: 2.1\nName: hc-dry-probe\nVersion: 0.1\n")
        z.writestr("hc_dry_probe-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n")
        z.writestr("hc_dry_probe-0.1.dist-info/RECORD", "")
    return folder


def run_all(tmp: Path, timeout: float, **env: str) -> tuple[int, str, dict[str, Any]]:
    out = tmp / "out"
    full = {**os.environ, "OUT": str(out), "TMPDIR": str(tmp), "PYTHON": sys.executable,
            "HC_WHEELS": str(tmp / "whl"), **env}
    full.pop("HC_GPU_OUT", None)
    proc = subprocess.run(["bash", str(RUN_ALL), "--cpu-dry-run"], env=full, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    summary = json.loads((out / "summary.json").read_text())
    return proc.returncode, proc.stdout + proc.stderr, summary


def test_cpu_dry_run_runs_every_step(tmp_path: Path) -> None:
    fake_wheel(tmp_path / "whl")
    rc, log, s = run_all(tmp_path, 540)
    assert rc == 0, log[-4000:]
    assert s["mode"] == "cpu-dry-run" and s["complete"] and s["failed"] == []
    names = [st["name"] for st in s["steps"]]
    assert names == ["wheels", "imports", "hf_ttft", "tests", "bench_kernels", "bench_overlap"]
    assert all(st["rc"] == 0 for st in s["steps"])
    # the carried wheels were unpacked (the .data part merged) into the site first on the path
    site = tmp_path / "hc_gpu_site"
    assert (site / "hc_dry_probe" / "__init__.py").exists()
    assert (site / "hc_dry_probe_extra.py").exists()

    hf = s["results"]["hf_ttft"]
    assert hf["errors"] == [] and hf["failures"] == [] and hf["skipped"] == []
    assert set(hf["preset_checks"]) == {"qwen3.5-0.8b", "qwen3.5-4b"}
    (case,) = hf["cases"]
    assert set(case["tiers"]) == {"device", "host", "nvme"}
    for tier, r in case["tiers"].items():
        for check in ("sync_check", "layerwise_check"):
            c = r[check]  # on CPU the restores are bit-exact
            assert c["state_rel_err"] == 0.0 and c["kv_rel_err"] == 0.0, (tier, check, c)
            assert c["logits_rel_err"] == 0.0 and c["top1_equal"], (tier, check, c)
        assert 0.0 <= r["hidden_share"] <= 1.0 and r["load_bytes"] > 0
        assert r["sync_ttft_s"] > 0 and r["layerwise_ttft_s"] > 0 and r["kernel_vs_copy"] > 0
    assert case["replay"]["replayed_anchors"] > 0 and not case["replay"]["exact"]
    assert s["headline"]["hf_ttft"]["prompt_tokens"] == case["prompt_tokens"]
    assert s["results"]["bench_kernels"]["kernels"] and s["results"]["bench_overlap"]["cases"]


def test_wheels_for_another_python_are_left_alone(tmp_path: Path) -> None:
    """After wheels.sh filled .whl with cp312 wheels, a dry run on another Python must not
    put them first on its path (a cp312 pydantic-core shadowing the venv's broke every
    import of the config schema)."""
    other = f"cp{sys.version_info.major}{sys.version_info.minor + 1}"
    fake_wheel(tmp_path / "whl")
    fake_wheel(tmp_path / "whl", f"{other}-{other}-manylinux_2_17_x86_64")
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "gpu_env.py"),
                           "install", str(tmp_path / "whl"), str(site)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nothing unpacked" in proc.stdout
    assert not site.exists() or not any(site.iterdir())


def test_a_step_past_its_timeout_is_cut_and_the_summary_still_written(tmp_path: Path) -> None:
    """Every step capped at 1 s: none can import torch and transformers in that time."""
    rc, log, s = run_all(tmp_path, 300, HC_GPU_STEP_MAX_S="1")
    assert rc == 1, log[-4000:]
    assert s["complete"]
    steps = {st["name"]: st for st in s["steps"]}
    assert steps["hf_ttft"]["timed_out"] and steps["hf_ttft"]["timeout_s"] == 1
    assert "hf_ttft" in s["failed"]
    assert "run_all: FAILED" in log
