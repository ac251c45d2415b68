"""vLLM reads VLLM_TARGET_DEVICE when it first resolves its platform: set it before any
test module imports vllm (no GPU here)."""

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
