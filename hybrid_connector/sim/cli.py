"""``hybrid-connector simulate`` and ``hybrid-connector gen-trace``.

``simulate --trace FILE --config FILE``: replays a JSONL trace through the real cache for
the configured policy set (``config.admission``/``eviction``/``alpha``/placement/anchors)
and, with ``--baselines``, every baseline of ``sim.baselines`` at the same byte budget;
prints one row per policy (token and request hit rate, FLOPs saved, modeled TTFT) and
optionally writes them as JSON (with objects and bytes stored, evicted and peak by kind).
The model is ``--model``, else the config's ``model``, else ``marconi-7b``: a preset name
or a geometry YAML, as the config allows. The cache is the config's own pool budgets per
kind (summed over its tiers) unless ``--size`` is given, which then overrides them with
one pool that KV and states share (the reference simulator's single cache size); the
output says which. Exit code 2 for a bad argument, trace, model or config.

``gen-trace KIND --out FILE``: writes a synthetic trace (``chat``, ``agentic``, ``docqa``,
``sysprompt``, ``oneshot``, ``blog_agentic``, ``blog_chat``, and the engine head-to-head's
``chat_edits``, ``agentic_branch``, ``multiround_qa``, ``mooncake``: >= 1,000 requests each
by default, lengths divided by ``--scale``) with the generator's documented defaults and the
given seed. ``mooncake --mooncake FILE`` replays a Mooncake-format file instead of
synthetic rows. ``--stats`` also prints the trace's reuse statistics (``sim.working_set``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hybrid_connector.core.config import ConfigError, HybridConfig, load_config
from hybrid_connector.core.config import parse_size as _parse_size

GEN_SIZES = {
    "chat": (64, 10), "agentic": (16, 30), "docqa": (8, 400), "sysprompt": (4, 600), "oneshot": (1000, 3),
    "blog_agentic": (15, 20), "blog_chat": (500, 40),
    "chat_edits": (128, 8), "agentic_branch": (24, 30), "multiround_qa": (200, 5), "mooncake": (1000, 6),
}
SCALED = ("chat_edits", "agentic_branch", "multiround_qa", "mooncake")  # take ``scale``


SIMULATE_HELP = """\
Replay a JSONL trace through the cache's policies (sizes only, no bytes) and print one
row per policy set: token and request hit rate, FLOPs saved, modeled time to first token.
With --baselines, vLLM, SGLang, LMCache and Marconi's policies run at the same budget."""

SIMULATE_EXAMPLES = """\
examples:
  hybrid-connector gen-trace agentic --out t.jsonl
  hybrid-connector simulate --trace t.jsonl --baselines
  hybrid-connector simulate --trace t.jsonl --config configs/vllm.yaml --size 8GiB --json rows.json"""

GEN_HELP = """\
Write a synthetic multi-turn trace as JSONL (session_id, turn_id, ts, input_tokens,
output_tokens), the input of 'hybrid-connector simulate' and the benchmarks. KIND picks the
workload; chat_edits, agentic_branch, multiround_qa and mooncake hold >= 1,000 requests."""

GEN_EXAMPLES = """\
examples:
  hybrid-connector gen-trace chat --out chat.jsonl --sessions 16 --stats
  hybrid-connector gen-trace chat_edits --out edits.jsonl --scale 8
  hybrid-connector gen-trace mooncake --mooncake mooncake_trace.jsonl --out mc.jsonl"""


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("simulate", help="replay a JSONL trace through the cache's policies",
                              description=SIMULATE_HELP, epilog=SIMULATE_EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", required=True, help="JSONL trace (session_id, turn_id, ts, input_tokens, output_tokens)")
    p.add_argument("--config", default=None, help="hybrid-connector YAML config (policies, alpha, placement, ...)")
    p.add_argument("--model", default=None, help="model preset or geometry YAML for byte/FLOP sizes (default: config.model or marconi-7b)")
    p.add_argument("--size", default=None, help="override the config's pool budgets: one cache size shared by KV and states (e.g. 8GiB)")
    p.add_argument("--baselines", action="store_true", help="also run every baseline policy set")
    p.add_argument("--grid", default=None, help="alpha grid for auto alpha and the oracle, e.g. 0,0.5,1,2")
    p.add_argument("--json", default=None, help="write the result rows to this JSON file")
    p.set_defaults(func=run)


def add_gen_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("gen-trace", help="write a synthetic JSONL trace",
                              description=GEN_HELP, epilog=GEN_EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=sorted(GEN_SIZES), metavar="KIND",
                   help=f"workload: {', '.join(sorted(GEN_SIZES))}")
    p.add_argument("--out", required=True, help="JSONL file to write")
    p.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    p.add_argument("--sessions", type=int, default=None, help="sessions / documents / prompt families")
    p.add_argument("--turns", type=int, default=None, help="turns per session / questions / queries")
    p.add_argument("--scale", type=int, default=1, help=f"divide every length by this ({', '.join(SCALED)})")
    p.add_argument("--mooncake", default=None, help="mooncake: replay this Mooncake-format JSONL file")
    p.add_argument("--stats", action="store_true", help="also print unique/reusable tokens and the live peak")
    p.set_defaults(func=run_gen)


def run_gen(args: argparse.Namespace) -> int:
    from hybrid_connector.sim.traces import GENERATORS, save_jsonl, summarize

    a, b = GEN_SIZES[args.kind]
    gen = GENERATORS[args.kind]
    extra: dict[str, Any] = {"lengths": "sharegpt"} if args.kind == "chat" else {}
    if args.kind in SCALED:
        extra["scale"] = args.scale
    if (args.scale != 1 and args.kind not in SCALED) or (args.mooncake and args.kind != "mooncake"):
        print(f"gen-trace: --scale applies to {', '.join(SCALED)}, --mooncake to mooncake", file=sys.stderr)
        return 2
    try:
        if args.mooncake:
            from hybrid_connector.sim.traces_mooncake import read_rows, to_records

            records = to_records(read_rows(args.mooncake), args.seed, args.scale, as_arrays=True)
        else:
            records = gen(args.sessions or a, args.turns or b, args.seed, as_arrays=True, **extra)  # type: ignore[operator]
    except (OSError, ValueError) as exc:
        print(f"gen-trace: {exc}", file=sys.stderr)
        return 2
    n = save_jsonl(records, args.out)
    print(f"wrote {n} requests to {args.out}: {summarize(records)}")
    if args.stats:
        from hybrid_connector.sim.working_set import trace_stats

        print(f"reuse: {trace_stats(records)}")
    return 0


def _policy_spec(cfg: HybridConfig, grid: tuple[float, ...] | None) -> Any:
    """The configured policy set as a ``PolicySpec`` (what the cache would build)."""
    from hybrid_connector.policies import build
    from hybrid_connector.sim.baselines import PolicySpec, _auto, _lru

    # Only what the file sets: everything else keeps the simulator's token-granular base.
    over = cfg.explicit()
    over.pop("model", None)
    if grid:
        over["alpha_grid"] = grid
    acct = build.ACCOUNTING.get(cfg.eviction)
    anchors = cfg.replay
    evict = _lru if acct is None else _auto(acct, build.admission, anchors)
    return PolicySpec("configured", f"{cfg.admission} + {cfg.eviction} (from config)", over,
                      evict, build.admission, anchors=anchors, anchor_share=0.1 if anchors else 0.0)


def _cache_size(cfg: HybridConfig, size: str | None) -> tuple[Any, str]:
    """``--size`` as a pooled total, else the config's per-kind budgets; and a line saying
    which. Raises ValueError for a bad size or a config without any pool budget."""
    from hybrid_connector.tiers.size_only import Budget

    if size is not None:
        total = _parse_size(size)
        return total, (f"cache {total / 2**30:.2f} GiB shared by KV and states "
                       f"(--size {size} overrides the config's pool budgets)")
    budget = Budget.from_config(cfg)
    if not budget.total:
        raise ValueError("the config gives the cache no pool budget; pass --size")
    pools = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in budget.pools.items())
    return budget, f"cache from the config's pool budgets (all tiers): {pools}"


def run(args: argparse.Namespace) -> int:
    from hybrid_connector.geometry.presets import load_geometry
    from hybrid_connector.sim.baselines import baseline_specs
    from hybrid_connector.sim.simulate import run_spec
    from hybrid_connector.sim.traces import load_jsonl

    try:
        cfg = load_config(args.config, environ={})
        records = load_jsonl(args.trace)
        size, size_line = _cache_size(cfg, args.size)
        grid = tuple(float(x) for x in args.grid.split(",")) if args.grid else None
        spec = _policy_spec(cfg, grid)
        spec.config()  # a grid the tuner cannot use is a config error, reported here
        geometry = load_geometry(args.model or cfg.model or "marconi-7b")
    except (OSError, ValueError, ConfigError) as exc:
        print(f"simulate: {exc}", file=sys.stderr)
        return 2
    specs = [spec] + (baseline_specs(geometry, grid) if args.baselines else [])
    rows = []
    print(f"{len(records)} requests, model {geometry.name}, {size_line}")
    print(f"{'policy':18s} {'tok_hit':>8s} {'approx':>7s} {'req_hit':>8s} {'flops%':>7s} "
          f"{'ttft_p50':>9s} {'ttft_p95':>9s} {'alpha':>6s} {'states':>7s}")
    for s in specs:
        r = run_spec(records, s, geometry, size)
        rows.append(r.row())
        alpha = "-" if r.alpha is None else f"{r.alpha:.2f}"
        print(f"{r.policy:18s} {r.token_hit_rate:8.3f} {r.approx_hit_tokens / max(1, r.prompt_tokens):7.3f} "
              f"{r.request_hit_rate:8.3f} {100 * r.flops_saved_frac:6.1f}% {1e3 * r.ttft_p50:7.0f}ms "
              f"{1e3 * r.ttft_p95:7.0f}ms {alpha:>6s} {r.states_saved:7d}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0
