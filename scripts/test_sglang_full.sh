#!/usr/bin/env bash
# SGLang's real HiCache controllers on CPU with our storage backend (tests/sglang_full):
# build or complete .venv-sglang (scripts/install_sglang_full.sh), then run those tests in
# it. scripts/test.sh runs it after the main suite (the main .venv skips tests/sglang_full).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_sglang_full.sh
VENV="${VENV:-.venv-sglang}"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/sglang_full "$@"
