"""``from hybrid_connector import kernels`` and CPU calls never try to import cupy (it is optional)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import sys
attempts = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "cupy":
            attempts.append(name)
        return None
sys.meta_path.insert(0, Spy())
import torch
from hybrid_connector import kernels
from hybrid_connector.tiers import copy_engine
h = torch.randn(4, 8)
kernels.pack_anchors(h, [1, 2], dtype=torch.float8_e4m3fn)
kernels.gather_kv_blocks(torch.zeros(2, 3, 16, 1, 8), [0])
kernels.copy_state_pages(torch.zeros(3, 4), torch.zeros(3, 4), [0], [1])
assert kernels.backend_name(h) == "torch"
print("attempts", attempts)
"""


def test_no_cupy_import_on_cpu() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "attempts []" in out.stdout, out.stdout + out.stderr
