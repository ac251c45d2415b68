"""Cache server tests: our server in-process (``served``) or as a subprocess
(``server_support.ServerProcess``); the real ``lmcache_server``/``redis_server`` fixtures
come from tests/tiers."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tiers"))

from server_fixtures import lmcache_server, redis_server  # noqa: E402,F401  (fixtures)
