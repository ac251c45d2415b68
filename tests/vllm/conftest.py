"""vLLM reads VLLM_TARGET_DEVICE when it first resolves its platform: set it before any
test module imports vllm (no GPU here). The real-server fixtures come from tests/tiers."""

import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tiers"))

from server_fixtures import lmcache_server, redis_server  # noqa: E402,F401  (fixtures)
