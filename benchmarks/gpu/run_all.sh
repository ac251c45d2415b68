#!/usr/bin/env bash
# One-shot GPU check for the kernels and the copy engine (issue 6). Run from anywhere
# on a CUDA machine:  bash benchmarks/gpu/run_all.sh [--quick]
#
#   1. picks a Python with a CUDA build of torch ($PYTHON, else python3, else .venv)
#   2. picks the kernel launcher: CuPy if it compiles and runs the kernels (a probe
#      compares them with torch); else nvcc + libcuda (HC_KERNEL_BACKEND=cubin,
#      cubins cached in $HC_KERNEL_CACHE); the GPU box has no internet, so nothing is
#      pip-installed here (HC_KERNEL_BACKEND set by the caller skips the probe)
#   3. compiles every kernels/*.cu for sm_90 (scripts/check_cuda.sh) when nvcc exists
#   4. runs tests/kernels (CPU tests + CUDA-vs-torch bit-identity + stream ordering)
#   5. benchmarks/gpu/bench_kernels_gpu.py: kernel bandwidth / device copy_ bandwidth
#   6. benchmarks/gpu/bench_overlap.py: share of a layer-wise fetch hidden under compute
#   7. benchmarks/gpu/vllm_serve_check.py (when vllm imports): `vllm serve` of a tiny hybrid
#      model with and without HybridConnector: same outputs, connector loads, TTFT ratio
#
# Every step has its own timeout (sum < 8 min on one H200, 15 with the vllm_serve step); a failing step does not
# stop the later ones; the exit status is non-zero if any step failed. Logs go to
# $HC_GPU_OUT (default: $OUT if set, else /tmp/hc_gpu) as well as stdout.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
quick=""
[ "${1:-}" = "--quick" ] && quick="--quick"
logdir="${HC_GPU_OUT:-${OUT:-/tmp/hc_gpu}}"
mkdir -p "$logdir"
export HC_KERNEL_CACHE="${HC_KERNEL_CACHE:-${TMPDIR:-/tmp}/hc_kernel_cache}"
failed=()

has_cuda_torch() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }
py=""
for cand in "${PYTHON:-}" python3 "$root/.venv/bin/python"; do
  if [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 && has_cuda_torch "$cand"; then py="$cand"; break; fi
done
if [ -z "$py" ]; then
  echo "run_all: no Python with a CUDA-enabled torch and a visible GPU; nothing to run" >&2
  nvidia-smi -L 2>&1 || true
  exit 2
fi
echo "== environment"
nvidia-smi -L 2>&1 || true
"$py" -c 'import torch, sys; print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda, "|", torch.cuda.get_device_name())'

# The GPU box cannot reach a registry: if the project's own pure-python deps are
# missing there (tiers/__init__.py may import the core), install carried wheels from
# ./.whl (fetched elsewhere with `pip download`) before giving up.
if ! "$py" -c 'import kernels, tiers.copy_engine' >/dev/null 2>&1; then
  if [ -d "$root/.whl" ]; then
    "$py" -m pip install -q --no-index --find-links "$root/.whl" blake3 pydantic pyyaml zstandard aiofiles 2>&1 | tail -n 3 || true
  fi
  "$py" -c 'import kernels, tiers.copy_engine' || { echo "run_all: cannot import kernels / tiers.copy_engine" >&2; failed+=("imports"); }
fi

if [ -z "${HC_KERNEL_BACKEND:-}" ]; then
  # prefer CuPy, then nvcc + libcuda; each must pass a tiny compile-and-compare probe
  for cand in cupy cubin; do
    if HC_KERNEL_BACKEND=$cand timeout 45 "$py" benchmarks/gpu/probe_backend.py; then
      export HC_KERNEL_BACKEND=$cand
      break
    fi
  done
  if [ -z "${HC_KERNEL_BACKEND:-}" ]; then
    echo "run_all: neither cupy nor nvcc could run the kernels" >&2
    export HC_KERNEL_BACKEND=torch
    failed+=("launcher")
  fi
fi
echo "kernel backend: $HC_KERNEL_BACKEND"

step() {  # step NAME SECONDS CMD...
  local name="$1" secs="$2"
  shift 2
  echo "== $name (timeout ${secs}s)"
  local t0=$SECONDS
  timeout --kill-after=10 "$secs" "$@" 2>&1 | tee "$logdir/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "-- $name: rc=$rc in $((SECONDS - t0))s"
  [ "$rc" -eq 0 ] || failed+=("$name")
}

if command -v nvcc >/dev/null 2>&1; then
  step check_cuda 60 bash scripts/check_cuda.sh
fi
step tests 150 "$py" -m pytest tests/kernels -q -p no:cacheprovider -o addopts="" --timeout=120
step bench_kernels 100 "$py" benchmarks/gpu/bench_kernels_gpu.py $quick
step bench_overlap 80 "$py" benchmarks/gpu/bench_overlap.py $quick
if "$py" -c 'import vllm' >/dev/null 2>&1; then
  step vllm_serve 420 "$py" benchmarks/gpu/vllm_serve_check.py --timeout 240
else
  echo "== vllm_serve: skipped (vllm does not import in $py)"
fi

if [ "${#failed[@]}" -gt 0 ]; then
  echo "run_all: FAILED: ${failed[*]}"
  exit 1
fi
echo "run_all: all steps passed"
