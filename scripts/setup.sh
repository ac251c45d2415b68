#!/usr/bin/env bash
# Create .venv with the CPU build of torch and this package (core runtime deps only).
# torch==2.13.0 is installed FIRST: it is a CPU build on this machine's local disk, and
# installing it before anything else keeps pip from pulling a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e ".${EXTRAS:-}"
