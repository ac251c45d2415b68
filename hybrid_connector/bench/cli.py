"""``hybrid-connector bench capacity``: the capacity benchmark (see ``capacity``).

Prints a live progress bar, a table per workload at the headline ratio, the comparison of
ours with device-only LRU at the headline point, and where the JSON and the PNG went. Exit
codes: 0 done, 1 an accounting or verification failure, 2 a bad config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hybrid_connector.bench import report
from hybrid_connector.bench.objects import CorruptLoad
from hybrid_connector.bench.runner import AccountingError
from hybrid_connector.bench.schema import load_capacity_config

DEFAULT_OUT = Path("benchmarks") / "results"


BENCH_HELP = "Run a benchmark on this machine and write its results (JSON and a plot)."
CAPACITY_HELP = """\
Sweep the working set from below to far beyond the device tier's budget on real tiers
(device, host RAM, NVMe files) and compare this cache with device-only LRU and the peer
policies: token hit rate and modeled throughput per workload. Prints a table per workload
and where capacity.json and capacity.png went. Takes minutes on a CPU."""
EXAMPLES = """\
examples:
  hybrid-connector bench capacity
  hybrid-connector bench capacity --out /tmp/results --work /mnt/nvme/scratch
  hybrid-connector bench capacity --config configs/capacity-cpu.yaml --model nemotron-h-8b"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks (capacity: working set beyond the device tier)",
                       description=BENCH_HELP, epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    bsub = p.add_subparsers(dest="bench", required=True, metavar="BENCHMARK", title="benchmarks")
    c = bsub.add_parser("capacity", help="working set / device budget sweep on real tiers",
                        description=CAPACITY_HELP, epilog=EXAMPLES,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--config", help="YAML with a 'capacity:' section (default: the embedded "
                                    "default, configs/capacity-cpu.yaml)")
    c.add_argument("--out", help=f"directory for capacity.json / capacity.png (default {DEFAULT_OUT})")
    c.add_argument("--work", help="directory for the NVMe tier's files (default: system temp)")
    c.add_argument("--compute", choices=("modeled", "real"), help="override the config's compute mode")
    c.add_argument("--model", help="geometry preset sizing the objects (default qwen3.5-4b)")
    c.add_argument("--no-progress", action="store_true", help="no live progress bar")
    c.set_defaults(func=run)
    from hybrid_connector.bench.vllm_peers.cli import add_parser as add_vllm_peers

    add_vllm_peers(bsub)


def run(args: argparse.Namespace) -> int:
    from hybrid_connector.bench.capacity import run_capacity, summary

    over: dict[str, Any] = {}
    if args.compute:
        over["compute"] = args.compute
    if args.model:
        over["model"] = args.model
    cfg = load_capacity_config(args.config, over)  # ConfigError: exit 2 (cli.main)
    out = Path(args.out) if args.out else DEFAULT_OUT
    suffix = "" if cfg.compute == "modeled" else "_real"
    try:
        doc = run_capacity(cfg, Path(args.work) if args.work else None, progress=not args.no_progress)
    except (AccountingError, CorruptLoad) as exc:
        print(f"bench capacity: FAILED: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"bench capacity: {exc}", file=sys.stderr)
        return 2
    scaled = int(doc["geometry"]["byte_scale"]) > 1
    for w in doc["workloads"]:
        ratio = cfg.headline_ratio if cfg.headline_ratio in cfg.ratios else cfg.ratios[-1]
        ws = doc["workloads"][w]
        print(f"\n{w}: {ws['summary']['requests']} requests, working set "
              f"{ws['working_set_bytes'] / 1e6:.1f} MB{' (scaled)' if scaled else ''}, at {ratio:g}x "
              f"working set / device budget ({cfg.compute} compute)")
        print(report.table(doc["rows"], w, ratio, scaled))
    print()
    print(summary(doc))
    jpath, ppath = out / f"capacity{suffix}.json", out / f"capacity{suffix}.png"
    report.write_json(jpath, doc)
    g = doc["geometry"]
    where = "GPU HBM" if doc["device"].startswith("cuda") else "a CPU pool (no GPU)"
    why = report.plot(ppath, doc["rows"], list(doc["workloads"]),
                      f"{g['geometry']} objects (bytes / {g['byte_scale']}), {cfg.compute} compute, "
                      f"device tier: {where}; solid: ours, dashed: LRU / vLLM-style")
    print(f"\nwall time {doc['wall_s']:.0f} s")
    print(f"JSON: {jpath.resolve()}")
    print(f"PNG:  {ppath.resolve()}" if why is None else f"PNG not written: {why}")
    return 0
