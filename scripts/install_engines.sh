#!/usr/bin/env bash
# Install the engine packages the integration tests run against, on CPU, without their
# CUDA dependencies:
#   * vllm 0.33.0 (--no-deps; it pins a CUDA torch 2.14.0) plus the light packages its
#     connector, scheduler, config and model-registry modules import;
#   * compressed-tensors 0.17.0 (--no-deps), which vLLM's model inspection imports.
# torch stays the CPU build: every pip call here is constrained to the installed torch.
# Usage: PYTHON=/path/to/venv/bin/python scripts/install_engines.sh   (default: python3)
# Idempotent; exits non-zero with a message on any failure.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
VLLM_VERSION="0.33.0"
LIGHT_DEPS=(regex cachetools psutil sentencepiece requests tqdm blake3 py-cpuinfo tokenizers
    safetensors protobuf "fastapi<0.137" aiohttp openai pydantic orjson prometheus_client pillow
    pyzmq msgspec pyyaml einops cloudpickle cbor2 pybase64 setproctitle typing_extensions
    filelock partial-json-parser openai-harmony uvloop xgrammar llguidance loguru)

NAME=install_engines.sh
PINNED="vllm|compressed-tensors"
# shellcheck source=scripts/pinned_pip.sh
source "$(dirname "${BASH_SOURCE[0]}")/pinned_pip.sh"

have_vllm() {
    VLLM_TARGET_DEVICE=cpu "$PYTHON" - <<'PY' >/dev/null 2>&1
import importlib.metadata as md, sys
ok = md.version("vllm") == "0.33.0"
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA  # noqa
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa
from vllm.v1.core.sched.scheduler import Scheduler  # noqa
import compressed_tensors  # noqa
sys.exit(0 if ok else 1)
PY
}

if ! have_vllm; then
    "${PIP[@]}" --no-deps "vllm==${VLLM_VERSION}" "compressed-tensors==0.17.0" \
        || die "pip install vllm==${VLLM_VERSION} failed"
    pip_light "${LIGHT_DEPS[@]}"
    have_vllm || die "vllm ${VLLM_VERSION} installed but its connector/scheduler modules do not import"
fi
torch_unchanged
