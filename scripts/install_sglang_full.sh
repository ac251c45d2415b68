#!/usr/bin/env bash
# Build .venv-sglang: a second virtual environment in which SGLang 0.5.23's HiCache
# controller (sglang.srt.managers.cache_controller.HiCacheController), the hybrid
# controller (mem_cache/hybrid_cache/hybrid_cache_controller.py) and the real host pools
# (mem_cache/pool_host/mha.py, mamba.py; memory_pool_host.py) import on CPU, for
# tests/sglang_full. The main .venv cannot: those modules import sglang.srt.configs, which
# imports torchvision, and no torchvision imports beside the CPU torch 2.13.0 there.
#   * torch 2.14.1 + torchvision 0.29.1 first (a CUDA build on this machine's local disk,
#     about 5.5 GB, no download; it runs on CPU);
#   * this project, editable, with its [dev] extras (constrained to that torch);
#   * sglang 0.5.23 with --no-deps plus the light packages the controller and host pools
#     import (found by trial, LIGHT_DEPS below).
# Usage: scripts/install_sglang_full.sh   (PYTHON=python3.11 by default; VENV to relocate)
# Idempotent (a complete venv is left alone, a partial one is completed); exits non-zero
# with a message on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_PYTHON="${PYTHON:-python3.11}"
VENV="${VENV:-.venv-sglang}"
TORCH_VERSION="2.14.1"
TORCHVISION_VERSION="0.29.1"
SGLANG_VERSION="0.5.23"
LIGHT_DEPS=(IPython starlette apache-tvm-ffi dill compressed-tensors gguf pybase64 orjson psutil requests tqdm pydantic pyzmq msgspec
    "transformers==5.20.2" safetensors sentencepiece einops)

die() { echo "install_sglang_full.sh: $*" >&2; exit 1; }
# pip, its notes about this machine's local indexes (and, for the --no-deps sglang, about
# its pins) filtered; pip's own exit status kept.
pip_q() {
    "${PIP[@]}" "$@" 2>&1 | { grep -v -E "^WARNING: Location|^(ERROR: pip's dependency resolver|sglang .* requires)" || true; }
    return "${PIPESTATUS[0]}"
}

have_all() {
    "$VENV/bin/python" - <<'PY' >/dev/null 2>&1
import importlib.metadata as md, sys
import torch, torchvision  # noqa: F401
ok = torch.__version__.split("+")[0] == "2.14.1" and md.version("sglang") == "0.5.23"
from sglang.srt.managers.cache_controller import HiCacheController  # noqa: F401
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (  # noqa: F401
    HybridCacheController,
)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: F401
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: F401
import sglang.srt.mem_cache.memory_pool_host  # noqa: F401
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: F401
import hybrid_connector.integrations.sglang  # noqa: F401
import pytest  # noqa: F401
sys.exit(0 if ok else 1)
PY
}

[ -x "$VENV/bin/python" ] && have_all && { echo "install_sglang_full.sh: $VENV is complete"; exit 0; }

command -v "$BASE_PYTHON" >/dev/null || die "$BASE_PYTHON not found (set PYTHON to a Python 3.11)"
[ -x "$VENV/bin/python" ] || "$BASE_PYTHON" -m venv "$VENV" || die "cannot create $VENV"
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q --disable-pip-version-check)

pip_q "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" \
    || die "pip install torch==${TORCH_VERSION} torchvision==${TORCHVISION_VERSION} failed"
# From here every pip call is constrained to that torch (and torchvision): the shared
# constraints file, PIP command and torch_unchanged check of the other install scripts.
NAME=install_sglang_full.sh
PYTHON="$PY"
PINNED="sglang"
# shellcheck source=scripts/pinned_pip.sh
source scripts/pinned_pip.sh
echo "torchvision==${TORCHVISION_VERSION}" >> "$CONSTRAINTS"

pip_q -e ".[dev]" || die "pip install -e .[dev] failed"
pip_q --no-deps "sglang==${SGLANG_VERSION}" || die "pip install sglang==${SGLANG_VERSION} failed"
pip_q "${LIGHT_DEPS[@]}" || die "pip install of the light dependencies failed: ${LIGHT_DEPS[*]}"

torch_unchanged
have_all || die "installed, but the controller or host pools do not import; run:
  $PY -c 'from sglang.srt.managers.cache_controller import HiCacheController'"
echo "install_sglang_full.sh: $VENV ready"
