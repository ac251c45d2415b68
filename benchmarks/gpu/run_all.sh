#!/usr/bin/env bash
# The GPU proof in one run (issues 6 and 28), from the repository root:
#   bash benchmarks/gpu/run_all.sh                on the GPU machine: under 9 minutes on one H200
#   bash benchmarks/gpu/run_all.sh --cpu-dry-run  every step's code path on CPU at tiny sizes (CI:
#                                                 tests/bench/test_gpu_dry_run.py runs it)
# --quick: fewer repetitions in the kernel and overlap benchmarks. Environment: OUT or HC_GPU_OUT
# (logs, per-step JSON and summary.json; default /tmp/hc_gpu), PYTHON, HC_GPU_BUDGET_S (the
# whole run's wall-clock budget: 540 s, dry run 300 s), HC_WHEELS (carried wheels, default
# ./.whl, see wheels.sh), HC_KERNEL_BACKEND (set: the launcher probe is skipped),
# HC_GPU_STEP_MAX_S (caps every step's timeout), HC_NVME_DIR (the NVMe tier's files; default
# ./.hc_nvme, removed afterwards; never under $OUT, whose files are copied back).
#
# Steps, in order of importance (each under `timeout`, capped by what is left of the budget;
# a step that fails or times out does not stop the later ones; one left under 20 s of budget
# is skipped; summary.json is rewritten after every step, so a cut run still leaves one):
#   python      GPU: the first of $PYTHON, python3, .venv with a CUDA torch; dry run: any torch
#   wheels      unpack the carried wheels into $TMPDIR/hc_gpu_site, first on PYTHONPATH (gpu_env.py)
#   imports     everything the steps import (gpu_env.py check [--gpu])
#   probe       GPU: the kernel launcher, CuPy else nvcc + libcuda (probe_backend.py)
#   hf_ttft     bench_hf_ttft.py: transformers runtime, Qwen3.5-0.8B's geometry, bf16, 8K and
#               32K prompts: full prefill vs hits from device / pinned host / NVMe (sync and
#               layer-wise through the copy engine + kernels), replay hit, checks vs full prefill
#   tests       pytest tests/kernels (CUDA bit-identity, stream ordering); dry run: the same
#               command collecting one file (the main suite runs them all on CPU)
#   bench_kernels  kernel bandwidth vs a device copy_ (bench_kernels_gpu.py --quick)
#   bench_overlap  share of a layer-wise fetch hidden under compute (bench_overlap.py --quick)
#   hf_ttft_4b  GPU, when >= 150 s are left: Qwen3.5-4B's geometry at 32K (dry run: its config
#               and geometry are checked on the meta device inside hf_ttft)
#   check_cuda  GPU with nvcc: hybrid_connector/kernels/*.cu compile for sm_90
#   vllm_serve  when vllm imports (not on the H200 machine: no vLLM there)
# Exit status: 0 when every step that ran passed, 1 otherwise, 2 without a usable Python.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
dry=0
quick=""
for arg in "$@"; do
  case "$arg" in
    --cpu-dry-run) dry=1 ;;
    --quick) quick="--quick" ;;
    *) echo "run_all: unknown argument $arg" >&2; exit 2 ;;
  esac
done
mode=gpu
[ "$dry" -eq 1 ] && mode=cpu-dry-run
logdir="${HC_GPU_OUT:-${OUT:-/tmp/hc_gpu}}"
mkdir -p "$logdir"
: > "$logdir/steps.tsv"
budget="${HC_GPU_BUDGET_S:-$([ "$dry" -eq 1 ] && echo 300 || echo 540)}"
export HC_KERNEL_CACHE="${HC_KERNEL_CACHE:-${TMPDIR:-/tmp}/hc_kernel_cache}"
export PYTHONUNBUFFERED=1
# Dry run: tiny tensors on a shared CPU, where intra-op threads only contend.
[ "$dry" -eq 1 ] && export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
failed=()

# ---------------------------------------------------------------- python
# One interpreter start per candidate: GPU: its torch sees a CUDA device; dry run: it has torch.
describe() {
  if [ "$dry" -eq 1 ]; then  # finding torch is enough: importing it costs seconds on a busy CPU
    "$1" -c 'import importlib.util as u, sys
if u.find_spec("torch") is None:
    sys.exit(1)
print("python", sys.version.split()[0], "| torch found | dry run on CPU")' 2>/dev/null
    return
  fi
  "$1" -c 'import sys, torch
if not torch.cuda.is_available():
    sys.exit(1)
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda, "|", torch.cuda.get_device_name())' 2>/dev/null
}
py=""
cands=("${PYTHON:-}" python3 "$root/.venv/bin/python")
[ "$dry" -eq 1 ] && cands=("${PYTHON:-}" "$root/.venv/bin/python" python3)
for cand in "${cands[@]}"; do
  if [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 && env_line="$(describe "$cand")"; then py="$cand"; break; fi
done
if [ -z "$py" ]; then
  why="no Python with torch$([ "$dry" -eq 0 ] && echo ' (CUDA build, visible GPU)'); nothing to run"
  echo "run_all: $why" >&2
  { command -v nvidia-smi >/dev/null && nvidia-smi -L; } 2>&1 || true
  printf '{"mode": "%s", "complete": true, "failed": ["python"], "error": "%s", "steps": []}\n' \
    "$mode" "$why" > "$logdir/summary.json"
  exit 2
fi
echo "== environment ($mode, budget ${budget}s, output $logdir)"
[ "$dry" -eq 0 ] && { command -v nvidia-smi >/dev/null && nvidia-smi -L; } 2>&1 || true
echo "$env_line"

summarize() { "$py" benchmarks/gpu/summary.py "$logdir" "$mode" "$budget" "$@" || echo "run_all: summary failed" >&2; }
left() { echo $((budget - SECONDS)); }
step() {  # step NAME MAX_SECONDS CMD...: run under min(MAX, budget left - 10)
  local name="$1" secs="$2"
  shift 2
  local room=$(( $(left) - 10 ))
  if [ "$room" -lt 20 ]; then
    echo "== $name: skipped ($(left)s of the budget left)"
    printf '%s\t%s\t%s\t%s\n' "$name" -1 0 0 >> "$logdir/steps.tsv"
    summarize
    return
  fi
  [ "$secs" -gt "$room" ] && secs=$room
  [ "${HC_GPU_STEP_MAX_S:-0}" -gt 0 ] && [ "$secs" -gt "$HC_GPU_STEP_MAX_S" ] && secs=$HC_GPU_STEP_MAX_S
  echo "== $name (timeout ${secs}s)"
  local t0=$SECONDS
  timeout --kill-after=10 "$secs" "$@" 2>&1 | tee "$logdir/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "-- $name: rc=$rc in $((SECONDS - t0))s"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$secs" >> "$logdir/steps.tsv"
  [ "$rc" -eq 0 ] || failed+=("$name")
  summarize
}

# ---------------------------------------------------------------- wheels, imports
wheels="${HC_WHEELS:-$root/.whl}"
site="${TMPDIR:-/tmp}/hc_gpu_site"  # not under $OUT: what is there is copied back
if compgen -G "$wheels/*.whl" >/dev/null; then
  step wheels 60 "$py" benchmarks/gpu/gpu_env.py install "$wheels" "$site"
fi
export PYTHONPATH="$site:$root${PYTHONPATH:+:$PYTHONPATH}"
step imports 90 "$py" benchmarks/gpu/gpu_env.py check $([ "$dry" -eq 0 ] && echo --gpu)

# ---------------------------------------------------------------- kernel launcher
if [ "$dry" -eq 0 ] && [ -z "${HC_KERNEL_BACKEND:-}" ]; then
  for cand in cupy cubin; do
    if HC_KERNEL_BACKEND=$cand step "probe_$cand" 45 "$py" benchmarks/gpu/probe_backend.py; then :; fi
    if tail -n 1 "$logdir/steps.tsv" | awk -F'\t' '{ exit !($2 == "0") }'; then export HC_KERNEL_BACKEND=$cand; break; fi
  done
  if [ -z "${HC_KERNEL_BACKEND:-}" ]; then
    echo "run_all: neither cupy nor nvcc could run the kernels" >&2
    export HC_KERNEL_BACKEND=torch
    failed+=("launcher")
  else
    failed=("${failed[@]/probe_cupy/}")  # cupy failing is fine when the cubin path works
  fi
fi
echo "kernel backend: ${HC_KERNEL_BACKEND:-auto}"

# ---------------------------------------------------------------- the steps
if [ "$dry" -eq 1 ]; then
  step hf_ttft 240 "$py" benchmarks/gpu/bench_hf_ttft.py --cpu-dry-run --out "$logdir/hf_ttft.json"
  step tests 120 "$py" -m pytest tests/kernels/test_kernels_copy_engine.py -q -p no:cacheprovider \
    -o addopts="" --noconftest --timeout=120 --collect-only
  step bench_kernels 90 "$py" benchmarks/gpu/bench_kernels_gpu.py --cpu-dry-run --json "$logdir/bench_kernels.json"
  step bench_overlap 60 "$py" benchmarks/gpu/bench_overlap.py --cpu-dry-run --json "$logdir/bench_overlap.json"
else
  nvme="${HC_NVME_DIR:-$root/.hc_nvme}"  # the NVMe tier's files: on the machine's disk, not in $OUT
  mkdir -p "$nvme"
  step hf_ttft 270 "$py" benchmarks/gpu/bench_hf_ttft.py --budget-s 200 --nvme-dir "$nvme" \
    --out "$logdir/hf_ttft.json"
  step tests 120 "$py" -m pytest tests/kernels -q -p no:cacheprovider -o addopts="" --noconftest --timeout=100
  step bench_kernels 60 "$py" benchmarks/gpu/bench_kernels_gpu.py $quick --json "$logdir/bench_kernels.json"
  step bench_overlap 50 "$py" benchmarks/gpu/bench_overlap.py $quick --json "$logdir/bench_overlap.json"
  if [ "$(left)" -ge 150 ]; then
    room=$(( $(left) - 20 )); [ "$room" -gt 180 ] && room=180
    step hf_ttft_4b "$room" "$py" benchmarks/gpu/bench_hf_ttft.py --preset qwen3.5-4b --lengths 32768 \
      --hit-reps 2 --full-reps 1 --budget-s $((room - 70)) --nvme-dir "$nvme" --out "$logdir/hf_ttft_4b.json"
  else
    echo "== hf_ttft_4b: skipped ($(left)s of the budget left, needs 150)"
  fi
  rm -rf "$nvme"
  if command -v nvcc >/dev/null 2>&1; then step check_cuda 60 bash scripts/check_cuda.sh; fi
  if "$py" -c 'import vllm' >/dev/null 2>&1; then
    step vllm_serve 420 "$py" benchmarks/gpu/vllm_serve_check.py --timeout 240
  fi
fi

summarize --final
echo "summary: $logdir/summary.json"
real=()
for f in "${failed[@]}"; do [ -n "$f" ] && real+=("$f"); done
if [ "${#real[@]}" -gt 0 ]; then
  echo "run_all: FAILED: ${real[*]}"
  exit 1
fi
echo "run_all: all steps passed ($SECONDS s)"
