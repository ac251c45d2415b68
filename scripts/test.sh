#!/usr/bin/env bash
# Install everything the test suite needs, run the static checks, then the whole suite.
# Extra arguments go to pytest (e.g. scripts/test.sh -k radix).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="[dev]" bash scripts/setup.sh
PY=.venv/bin/python
if [ -f scripts/install_servers.sh ]; then PYTHON=$PY bash scripts/install_servers.sh; fi
if [ -f scripts/install_engines.sh ]; then PYTHON=$PY bash scripts/install_engines.sh; fi
if [ -f scripts/install_sglang.sh ]; then PYTHON=$PY bash scripts/install_sglang.sh; fi
if [ -f scripts/check_cuda.sh ] && command -v nvcc >/dev/null; then bash scripts/check_cuda.sh; fi
$PY -m ruff check .
$PY -m mypy
# pytest's own status is the one reported. -X faulthandler: a process that dies of a signal
# (e.g. SIGABRT from a native thread still running at exit) prints every thread's stack.
rc=0
$PY -X faulthandler -m pytest -q -p no:cacheprovider "$@" || rc=$?
if [ "$rc" -gt 128 ]; then
    echo "scripts/test.sh: pytest died of signal $((rc - 128)) (status $rc), after its summary" \
         "if one is printed above: something the suite started was still running at exit" \
         "(tests/conftest.py lists what it finds; the stacks above show where)" >&2
fi
[ "$rc" -eq 0 ] || exit "$rc"
# SGLang's real HiCache controllers need torchvision, which only imports beside the CUDA
# torch 2.14.1 build: their tests run in a second venv (.venv-sglang, ~3 min to build).
if [ -f scripts/test_sglang_full.sh ] && [ "$#" -eq 0 ]; then bash scripts/test_sglang_full.sh; fi
