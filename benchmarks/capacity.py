"""Capacity benchmark beyond HBM: the working set of a multi-session workload against a
device budget from 0.5x to 8x smaller, through real tiers (device pool, host RAM, NVMe)
with real bytes and the real ``HybridCache``, our policies vs LRU vs vLLM-style per-block
caching, plus LMCache's own CPU and disk backends on the same objects. The engine lives in
``hybrid_connector.bench`` (installed); this script is the same as the command

    hybrid-connector bench capacity [--config configs/capacity-cpu.yaml] [--out DIR]

and writes ``benchmarks/results/capacity.{json,png}`` (``capacity_real.*`` with
``--compute real``).
"""

# ruff: noqa: E402  (imports follow the sys.path fix below)
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

from hybrid_connector.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--out" not in args:
        args += ["--out", os.path.join(_HERE, "results")]
    sys.exit(main(["bench", "capacity", *args]))
