#!/usr/bin/env bash
# Download the wheels the GPU machine lacks into ./.whl (gitignored), for its Python: cp312,
# manylinux x86_64. The machine has python3.12 with torch 2.11 (CUDA 13), transformers 5.17,
# cupy-cuda13x 14.2, triton, numpy, pyyaml, aiofiles, xxhash, sortedcontainers, uvloop,
# prometheus-client, tqdm and matplotlib, and reaches no index; run_all.sh unpacks these
# wheels there (gpu_env.py install, no pip needed). Run here, where PyPI is reachable:
#
#   bash benchmarks/gpu/wheels.sh [DEST]        (default ./.whl; replaces its wheels)
#   bash benchmarks/gpu/wheels.sh --check       (also: closure.py runs every step's code path
#                                                and checks wheels.txt covers its imports)
#
# The list is wheels.txt (pinned). Exact names only, no dependency resolution (--no-deps):
# each wheel's own requirements are either on the machine or listed. Fails when the set is
# over 60 MiB (a run carries at most 64 MiB).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
check=0
dest="$root/.whl"
for arg in "$@"; do
  case "$arg" in
    --check) check=1 ;;
    *) dest="$arg" ;;
  esac
done
py="${PYTHON:-}"
[ -z "$py" ] && { [ -x "$root/.venv/bin/python" ] && py="$root/.venv/bin/python" || py=python3; }
if [ "$check" -eq 1 ]; then
  "$py" benchmarks/gpu/closure.py benchmarks/gpu/wheels.txt
fi
mkdir -p "$dest"
rm -f "$dest"/*.whl
"$py" -m pip download -q --no-deps --only-binary=:all: -d "$dest" \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any \
  -r benchmarks/gpu/wheels.txt 2> >(grep -v "is ignored: it is neither a file" >&2)
total=0
for whl in "$dest"/*.whl; do
  size=$(stat -c %s "$whl")
  total=$((total + size))
  printf '%10d  %s\n' "$size" "$(basename "$whl")"
done
printf '%10d  total (%s MiB) in %s\n' "$total" "$(awk -v b="$total" 'BEGIN { printf "%.2f", b / 1048576 }')" "$dest"
if [ "$total" -gt $((60 * 1024 * 1024)) ]; then
  echo "wheels.sh: over 60 MiB; a run carries at most 64 MiB" >&2
  exit 1
fi
