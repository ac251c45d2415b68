#!/usr/bin/env bash
# Install SGLang 0.5.23 on CPU for the HiCache storage backend tests, without its CUDA
# dependencies:
#   * sglang 0.5.23 with --no-deps (it pins a CUDA torch and sgl-kernel);
#   * the light packages `sglang.srt.mem_cache.hicache_storage` (HiCacheStorage, HiCacheFile,
#     PoolTransfer, count_pool_hits, HiCacheStorageFailureInjector), the storage backend factory
#     and the page hash function need to import (found by trial: IPython only, next to what
#     scripts/install_engines.sh installs).
# torch stays the CPU build: every pip call here is constrained to the installed torch.
# Usage: PYTHON=/path/to/venv/bin/python scripts/install_sglang.sh   (default: python3)
# Idempotent; exits non-zero with a message on any failure.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
SGLANG_VERSION="0.5.23"
LIGHT_DEPS=(IPython)

NAME=install_sglang.sh
PINNED="sglang"
# shellcheck source=scripts/pinned_pip.sh
source "$(dirname "${BASH_SOURCE[0]}")/pinned_pip.sh"

have_sglang() {
    "$PYTHON" - <<'PY' >/dev/null 2>&1
import importlib.metadata as md, sys
ok = md.version("sglang") == "0.5.23"
from sglang.srt.mem_cache.hicache_storage import (  # noqa: F401
    HiCacheFile, HiCacheStorage, HiCacheStorageFailureInjector, PoolHitPolicy, PoolName,
    PoolTransfer, count_pool_hits,
)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: F401
from sglang.srt.mem_cache.utils import get_hash_str  # noqa: F401
sys.exit(0 if ok else 1)
PY
}

if ! have_sglang; then
    "${PIP[@]}" --no-deps "sglang==${SGLANG_VERSION}" || die "pip install sglang==${SGLANG_VERSION} failed"
    pip_light "${LIGHT_DEPS[@]}"
    have_sglang || die "sglang ${SGLANG_VERSION} installed but sglang.srt.mem_cache.hicache_storage does not import"
fi
torch_unchanged
