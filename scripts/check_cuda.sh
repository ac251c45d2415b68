#!/usr/bin/env bash
# Compile every CUDA source in hybrid_connector/kernels/ with nvcc for sm_90 (H100/H200), as CI does.
# Each .cu must build on its own (its only include is hybrid_connector/kernels/dtype_convert.cuh, found
# next to it); warnings are errors. Exits non-zero on the first failure.
# Usage: scripts/check_cuda.sh [arch]   (default sm_90)
set -euo pipefail
arch="${1:-sm_90}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! command -v nvcc >/dev/null 2>&1; then
  echo "check_cuda: nvcc not found on PATH" >&2
  exit 1
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
shopt -s nullglob
sources=("$root"/hybrid_connector/kernels/*.cu)
if [ "${#sources[@]}" -eq 0 ]; then
  echo "check_cuda: no hybrid_connector/kernels/*.cu found" >&2
  exit 1
fi
echo "check_cuda: $(nvcc --version | tail -n 1)"
for src in "${sources[@]}"; do
  name="$(basename "$src" .cu)"
  nvcc -arch="$arch" -O3 -std=c++17 --cubin -Werror all-warnings -Xptxas -warn-spills \
    -o "$out/$name.cubin" "$src"
  # list the entry points that landed in the cubin, so a renamed kernel is visible
  kernels_in="$(grep -ao "hc_[a-z0-9_]*" "$out/$name.cubin" | sort -u | tr "\n" " " || true)"
  echo "check_cuda: compiled hybrid_connector/kernels/$name.cu for $arch (${kernels_in:-entry points not listed})"
done
echo "check_cuda: ${#sources[@]} CUDA source(s) OK"
