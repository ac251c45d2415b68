"""``hybrid-connector bench vllm-peers``: this connector against vLLM's own offloading
connectors inside vLLM 0.33's real Scheduler (see ``vllm_peers``). Prints a table per trace,
who wins at each budget and where the JSON, text and PNG went. Exit codes: 0 done, 1 a run
read a wrong byte or did not finish, 2 vLLM is not installed."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path("benchmarks") / "results"
DESCRIPTION = """\
Serve the same traces through vLLM 0.33's own Scheduler (on CPU) with no connector, vLLM's
OffloadingConnector (LRU and ARC), vLLM's SimpleCPUOffloadConnector and this project's
connector, with the same device blocks and the same host bytes, at host budgets from a
quarter to four times each trace's working set. vLLM's code decides every hit; only the
workers' GPU copy routine is replaced by a CPU copy. Prints per trace and budget the token
hit rate, tokens recomputed, host bytes held and written per hit token, a modeled time to
first token of the unscaled model on an H200 (prefill FLOPs at a stated throughput plus
the connector's loads at a stated host-to-GPU bandwidth) and its ratio to the best of vLLM's
connectors, scheduler time per step, who wins by how much, and where the JSON, text and PNG
went. Needs vLLM 0.33 installed.

Opt-in (--peers only, not in the default sweep), host + disk tiers: offload-fs (vLLM's
OffloadingConnector with its TieringOffloadingSpec: the same host bytes plus its fs tier,
vLLM's own file I/O, in a temporary directory) and ours-nvme (ours with the shipped NVMe
tier, its disk budget what offload-fs's fs tier held in the same run, which has no
capacity of its own; run both together). Disk I/O finishes within each engine step, and
bytes a disk served are modeled at the NVMe rate."""
EXAMPLES = """\
examples:
  hybrid-connector bench vllm-peers --quick
  hybrid-connector bench vllm-peers --jobs 4
  hybrid-connector bench vllm-peers --traces chat_edits --peers none,offload-lru,ours
  hybrid-connector bench vllm-peers --peers ours-shipped --gpu-step-ms 28
  hybrid-connector bench vllm-peers --traces chat_edits,agentic_branch --multiples 0.25,1 \
      --peers offload-lru,offload-fs,ours-pooled,ours-nvme"""


def add_parser(bsub: Any) -> None:
    """Register ``vllm-peers`` under ``hybrid-connector bench``."""
    c = bsub.add_parser("vllm-peers", help="head-to-head with vLLM's OffloadingConnector and "
                                           "SimpleCPUOffloadConnector in vLLM's Scheduler",
                        description=DESCRIPTION, epilog=EXAMPLES,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--quick", action="store_true", help="two small traces, three budgets (~2 min)")
    c.add_argument("--out", help=f"directory for the results (default {DEFAULT_OUT})")
    c.add_argument("--traces", help="comma-separated subset of the traces")
    c.add_argument("--peers", help="comma-separated connectors (default: none, offload-lru, "
                                    "offload-arc, simple, ours, ours-pooled; opt-in: "
                                    "offload-fs, ours-nvme, host + disk tiers; "
                                    "ours-shipped, ours-pooled with the tuner as shipped)")
    c.add_argument("--concurrency", type=int, help="requests at once (default 4; quick 2)")
    c.add_argument("--multiples", help="comma-separated host budgets as multiples of the "
                                       "working set (default 0.25,0.5,1,2,4)")
    c.add_argument("--work", help="directory for the model config and each run's rows as they "
                                  "finish, with every request's prompt, hit and external hit "
                                  "tokens (rows-TRACE.jsonl; default: a temporary directory, "
                                  "removed at the end)")
    c.add_argument("--async-scheduling", action="store_true",
                   help="vLLM's AsyncScheduler (its default on a GPU): each step is scheduled "
                        "before the previous one's output is processed")
    c.add_argument("--gpu-step-ms", type=float, default=0.0,
                   help="the engine thread idles this long after each step, as vLLM's engine "
                        "core waits on the GPU's forward pass (a CPU run has none); a "
                        "connector's own threads get that time (default 0: back to back)")
    c.add_argument("--jobs", type=int, default=1, help="traces run at once, one process each")
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        print(f"bench vllm-peers: needs vLLM 0.33 ({exc})", file=sys.stderr)
        return 2
    import dataclasses

    from hybrid_connector.bench.vllm_peers import report as rep
    from hybrid_connector.bench.vllm_peers import sweep as vp
    from hybrid_connector.bench.vllm_peers.run import RunError

    cfg = vp.quick() if args.quick else vp.PeersConfig()
    if args.traces:
        names = args.traces.split(",")
        cfg = dataclasses.replace(cfg, traces={n: vp.PeersConfig().traces[n] if n not in cfg.traces
                                               else cfg.traces[n] for n in names})
    if args.concurrency:
        cfg = dataclasses.replace(cfg, concurrency=args.concurrency)
    if args.async_scheduling:
        cfg = dataclasses.replace(cfg, async_scheduling=True)
    if args.gpu_step_ms < 0:
        print(f"bench vllm-peers: --gpu-step-ms must be >= 0, got {args.gpu_step_ms:g}",
              file=sys.stderr)
        return 2
    if args.gpu_step_ms:
        cfg = dataclasses.replace(cfg, gpu_step_ms=args.gpu_step_ms)
    if args.multiples:
        cfg = dataclasses.replace(cfg, multiples=tuple(float(m) for m in args.multiples.split(",")))
    if args.peers:
        from hybrid_connector.bench.vllm_peers.setups import KNOWN

        unknown = sorted(set(args.peers.split(",")) - set(KNOWN))
        if unknown:
            print(f"bench vllm-peers: unknown peers {', '.join(unknown)}; known: "
                  f"{', '.join(KNOWN)}", file=sys.stderr)
            return 2
        cfg = dataclasses.replace(cfg, peers=tuple(args.peers.split(",")))
    try:
        doc = vp.run_sweep(cfg, progress=not args.no_progress, jobs=args.jobs,
                          work=Path(args.work) if args.work else None)
    except RunError as exc:
        print(f"bench vllm-peers: FAILED: {exc}", file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else DEFAULT_OUT
    stem = "vllm_peers_quick" if args.quick else "vllm_peers"
    report = rep.text(doc)
    print(report)
    jpath, tpath, ppath = (out / f"{stem}.json", out / f"{stem}.txt", out / f"{stem}.png")
    rep.write_json(jpath, doc)
    tpath.write_text(report + "\n")
    why = rep.plot(ppath, doc)
    print(f"\nwall time {doc['wall_s']:.0f} s")
    print(f"JSON: {jpath.resolve()}")
    print(f"text: {tpath.resolve()}")
    print(f"PNG:  {ppath.resolve()}" if why is None else f"PNG not written: {why}")
    return 0
