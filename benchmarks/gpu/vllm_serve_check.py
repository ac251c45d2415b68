"""On a GPU machine: ``vllm serve`` a tiny hybrid model with and without HybridConnector and
compare outputs, external hit tokens and TTFT. Not run on CPU (nothing here needs a GPU
except vLLM itself); ``benchmarks/gpu/run_all.sh`` runs it when vLLM imports.

    python benchmarks/gpu/vllm_serve_check.py [--arch nemotron_h|qwen3_next] [--port 8765]

Steps: write a tiny config (``tests/vllm/vllm_support.py``'s, random weights through
``--load-format dummy``, ``--skip-tokenizer-init``, so no download); start ``vllm serve``
once without the connector and once with it (``--kv-transfer-config`` as in the README,
a host tier of 256 MB, ``--num-gpu-blocks-override`` small so vLLM's own cache evicts);
send the same shared-prefix prompt-token requests (``/v1/completions`` with token-id
prompts, greedy, streamed to time the first token); then check: identical token outputs,
``vllm:hybrid_connector_load_jobs_total`` > 0 in ``/metrics`` with the connector, and print
TTFT median with / without as a ratio. Exit status 1 on any failed check. Each server run
is bounded (``--timeout`` per start, default 240 s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "vllm")]


def _post(url: str, body: dict[str, Any]) -> tuple[list[int], float]:
    """Stream one completion; returns its token ids and the time to the first token."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, toks = None, []
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            if ttft is None:
                ttft = time.perf_counter() - t0
            ch = json.loads(line[6:])["choices"][0]
            toks.extend(ch.get("token_ids") or [])
    return toks, ttft or float("nan")


def _wait(base: str, proc: subprocess.Popen, timeout: float) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}")
        try:
            urllib.request.urlopen(base + "/health", timeout=2)
            return
        except OSError:
            time.sleep(2)
    raise TimeoutError("vllm serve did not become healthy")


def serve_and_query(model: Path, port: int, connector: dict[str, Any] | None, prompts: list[list[int]],
                    timeout: float, log: Path) -> tuple[list[list[int]], list[float], str]:
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--port", str(port),
           "--load-format", "dummy", "--skip-tokenizer-init", "--enable-prefix-caching",
           "--max-model-len", "4096", "--num-gpu-blocks-override", "64", "--dtype", "bfloat16",
           "--seed", "0", "--enforce-eager"]
    if connector is not None:
        cmd += ["--kv-transfer-config", json.dumps(connector)]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(base, proc, timeout)
        outs, ttfts = [], []
        for p in prompts:
            toks, ttft = _post(base + "/v1/completions", {
                "model": str(model), "prompt": p, "max_tokens": 16, "temperature": 0.0,
                "stream": True, "return_token_ids": True, "ignore_eos": True})
            outs.append(toks)
            ttfts.append(ttft)
        metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        return outs, ttfts, metrics
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def main() -> int:
    import numpy as np
    import vllm_support as s

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="nemotron_h", choices=sorted(s.MODELS))
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--timeout", type=float, default=240.0)
    args = ap.parse_args()
    work = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="vllm_serve"))
    work.mkdir(parents=True, exist_ok=True)
    model = s.MODELS[args.arch](work)
    y = work / "hybrid.yaml"
    y.write_text("chunk_size: 1024\nhash_block_size: 16\nalignment: 16\n"
                 "pools:\n  host: {kv: 192MB, state: 64MB}\n")
    ktc = {"kv_connector": "HybridConnector", "kv_connector_module_path": "hybrid_connector.integrations.vllm",
           "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
           "kv_connector_extra_config": {"config_file": str(y)}}
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 128, 1500).tolist() for _ in range(6)]
    prompts = [d + rng.integers(0, 128, 40).tolist() for _ in range(2) for d in docs]
    base_out, base_ttft, _ = serve_and_query(model, args.port, None, prompts, args.timeout,
                                             work / "serve_native.log")
    out, ttft, metrics = serve_and_query(model, args.port, ktc, prompts, args.timeout,
                                         work / "serve_connector.log")
    loads = metric(metrics, "vllm:hybrid_connector_load_jobs_total")
    same = out == base_out
    second = slice(len(docs), None)  # the repeated documents, evicted on device by then
    r = statistics.median(ttft[second]) / statistics.median(base_ttft[second])
    print(f"outputs identical: {same}; connector loads: {loads:.0f}; TTFT median (repeats) "
          f"{statistics.median(ttft[second]) * 1e3:.1f} ms with vs "
          f"{statistics.median(base_ttft[second]) * 1e3:.1f} ms without ({r:.2f}x)")
    (work / "vllm_serve_check.json").write_text(json.dumps({
        "arch": args.arch, "identical": same, "load_jobs": loads, "ttft_with": ttft,
        "ttft_without": base_ttft, "ttft_ratio_repeats": r}, indent=1))
    return 0 if same and loads > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
