#!/usr/bin/env bash
# Install the real servers the tier integration tests talk to:
#   * lmcache 0.5.6 (--no-deps) plus exactly the light packages that `lmcache_server` and
#     `lmcache.v1.protocol` import on CPU (no CUDA wheels, torch untouched);
#   * redis-server and redis-cli (the cluster tests build a Redis Cluster with
#     `redis-cli --cluster create`) from Debian when either is missing.
# Usage: PYTHON=/path/to/venv/bin/python scripts/install_servers.sh   (default: python3)
# Idempotent and quiet; exits non-zero with a message on any failure.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
LMCACHE_VERSION="0.5.6"
# What `import lmcache.v1.protocol, lmcache.v1.server.__main__` and LMCache's own lm://
# connector and local backends (the interop tests drive them) pull in beyond
# torch/numpy/pyyaml (checked with sys.modules after the import).
LIGHT_DEPS=(sortedcontainers numba cachetools prometheus_client py-cpuinfo psutil aiohttp requests
            aiofile cryptography pyzmq)

die() { echo "install_servers.sh: $*" >&2; exit 1; }

"$PYTHON" -c "import torch" 2>/dev/null \
    || die "$PYTHON cannot import torch; install torch==2.13.0 first (never a CUDA build here)"

have_lmcache() {
    "$PYTHON" - <<'PY' 2>/dev/null
import importlib.metadata as md, sys
try:
    ok = md.version("lmcache") == "0.5.6"
    import lmcache.v1.protocol, lmcache.v1.server.__main__  # noqa: F401
    import lmcache.v1.storage_backend.connector.lm_connector  # noqa: F401
    import lmcache.v1.storage_backend.local_cpu_backend  # noqa: F401
except Exception:
    ok = False
sys.exit(0 if ok else 1)
PY
}

if ! have_lmcache; then
    "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps "lmcache==${LMCACHE_VERSION}" \
        || die "pip install lmcache==${LMCACHE_VERSION} failed"
    # Light deps with their own deps (none of them pull torch).
    "$PYTHON" -m pip install -q --disable-pip-version-check "${LIGHT_DEPS[@]}" 2>&1 \
        | grep -v -E "^(WARNING|ERROR: pip's dependency resolver|lmcache .* requires)" || true
    have_lmcache || die "lmcache ${LMCACHE_VERSION} installed but its server/protocol do not import"
fi

BIN_DIR="$("$PYTHON" -c 'import sys, os; print(os.path.dirname(sys.executable))')"
[ -x "$BIN_DIR/lmcache_server" ] || die "lmcache_server entry point missing in $BIN_DIR"

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq >/dev/null || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null \
        || die "apt-get install redis-server redis-tools failed"
    command -v redis-server >/dev/null 2>&1 || die "redis-server still missing after apt-get"
    command -v redis-cli >/dev/null 2>&1 || die "redis-cli still missing after apt-get"
fi
echo "install_servers.sh: lmcache_server ($BIN_DIR/lmcache_server) and redis-server ($(command -v redis-server)) ready"
