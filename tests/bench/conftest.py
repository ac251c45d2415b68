"""The op-speed helpers (``op_speed``) live with the tier tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tiers"))
