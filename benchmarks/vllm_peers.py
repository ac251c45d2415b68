"""Head-to-head inside vLLM 0.33.0's real Scheduler (CPU): this project's HybridConnector
against vLLM's OffloadingConnector (LRU, ARC) and SimpleCPUOffloadConnector, with vLLM's
prefix cache alone as the floor; same traces, device blocks and host bytes for every one.

Run: ``.venv/bin/python benchmarks/vllm_peers.py [--quick]`` (the same as
``hybrid-connector bench vllm-peers [--quick]``). Writes
``benchmarks/results/vllm_peers[_quick].{json,txt,png}``. See ``docs/vllm_peers.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hybrid_connector.bench.vllm_peers.cli import add_parser  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="bench", required=True)
    add_parser(sub)
    args = p.parse_args(["vllm-peers", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
