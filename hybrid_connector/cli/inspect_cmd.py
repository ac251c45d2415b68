"""``hybrid-connector inspect``: what a config and a model mean in bytes, before serving;
with ``--server URL``, what a running cache server holds (by model, tier and kind) and its
hit rates.

Prints the model's object sizes (KV per token, one checkpoint, anchors per token, the
checkpoint-to-KV-token ratio), the block size vLLM's align mode would force on it, the
effective per-tier, per-kind pool budgets and how many objects of each kind they hold, and
the fingerprint objects are stored under.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from hybrid_connector.core.config import TIERS, HybridConfig, load_config
from hybrid_connector.core.keys import model_fingerprint
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.geometry.presets import PRESETS, load_geometry


def vllm_align_block(geo: ModelGeometry, unit: int = 16) -> int | None:
    """Tokens per block vLLM's align mode uses: the attention block grows until one layer's
    attention page holds at least one layer's recurrent state page, in multiples of
    ``unit`` (``Platform._align_hybrid_block_size``). ``None`` without both layer kinds."""
    per_layer = geo.state_bytes_per_layer()
    n_attn = len(geo.attention_layers)
    if not per_layer or not n_attn:
        return None
    kv_token_layer = geo.kv_bytes_per_token() // n_attn
    return math.ceil(max(per_layer.values()) / kv_token_layer / unit) * unit


def _fmt(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def report(cfg: HybridConfig, geo: ModelGeometry) -> str:
    """The inspection text for ``cfg`` and ``geo`` (pure)."""
    kv_tok = geo.kv_bytes_per_token()
    state = geo.state_bytes()
    chunk = kv_tok * cfg.chunk_size
    anchor_page = geo.anchor_bytes_per_token() * max(1, round(cfg.anchor_density * cfg.anchor_page_size))
    block = vllm_align_block(geo)
    lines = [
        f"model {geo.name} ({geo.architecture}), {len(geo.layers)} layers: "
        f"{len(geo.attention_layers)} attention, {len(geo.recurrent_layers)} recurrent in "
        f"{len(geo.recurrent_groups())} groups, dtype {geo.dtype}, state {geo.state_dtype}, tp {geo.tp_size}",
        f"KV per token        {_fmt(kv_tok)}   (chunk of {cfg.chunk_size}: {_fmt(chunk)})",
        f"state checkpoint    {_fmt(state)}   (= KV of {state / max(kv_tok, 1):.0f} tokens)",
        f"anchors per page    ~{_fmt(anchor_page)}   ({cfg.anchor_page_size}-token page, density {cfg.anchor_density})",
        f"vLLM align block    {block if block else 'n/a'} tokens"
        + (f" (hits only every {block} tokens there; this cache aligns to {cfg.alignment})" if block else ""),
        f"policies            admission={cfg.admission} eviction={cfg.eviction} alpha={cfg.alpha} "
        f"placement_slots={cfg.placement_slots} replay={cfg.replay}",
        "pools (capacity in objects):",
    ]
    sizes = {"kv": chunk, "state": state, "anchor": anchor_page}
    for tier in TIERS:
        b = cfg.budget(tier)
        if not b.total:
            continue
        room = b.kinds()  # with kv_state, KV and states each up to the shared budget
        parts = [f"{k} {_fmt(room[k])} ({room[k] // max(sizes[k], 1)})" for k in sizes]
        lines.append(f"  {tier:7s} " + ", ".join(parts) + (" (kv and state: one shared budget)"
                                                           if b.pooled else ""))
    fp = model_fingerprint({**geo.fingerprint_fields(), "chunk": cfg.chunk_size,
                            "hash_block": cfg.hash_block_size, "model_id": ""})
    lines.append(f"fingerprint         {fp} (model_id and engine layout are added by the engine)")
    return "\n".join(lines)


def server_report(stats: dict[str, Any]) -> str:
    """The ``--server`` text for a server's ``STATS`` (pure)."""
    srv = stats["server"]
    lines = [f"server up {srv['uptime_s']:.0f} s, {srv['sessions']} sessions, "
             f"{srv['connections']} connections, {srv['leases']} leases"]
    for name, t in stats["tiers"].items():
        # ``pools`` counts a shared budget once; a server without it: per kind (no sharing)
        pools = t.get("pools") or t["capacity"]
        shared = [f"{p.replace('_', ' and ')} share {_fmt(b)}"
                  for p, b in pools.items() if "_" in p and b]
        lines.append(f"tier {name:7s} {_fmt(sum(t['used'].values()))} of "
                     f"{_fmt(sum(pools.values()))} used"
                     + (f" ({', '.join(shared)})" if shared else "")
                     + f", {t['hits']} hits, {t['misses']} misses")
    rows = [(fp, m) for fp, m in stats["models"].items()]
    rows += [(fp, {"name": "LMCache objects", "held": h}) for fp, h in stats["plain"]["held"].items()]
    for fp, model in rows:
        head = f"model {model.get('name') or '?'} [{fp}]"
        if "lookups" in model:
            head += (f": {model['lookups']} lookups, token hit rate "
                     f"{model['token_hit_rate']:.3f}, request hit rate {model['request_hit_rate']:.3f}")
        lines.append(head)
        for tier, kinds in sorted(model.get("held", {}).items()):
            parts = [f"{k} {n} ({_fmt(b)})" for k, (n, b) in sorted(kinds.items())]
            lines.append(f"  {tier:7s} " + ", ".join(parts))
    return "\n".join(lines)


INSPECT_HELP = """\
See what a config means for a model before serving: KV bytes per token, one state
checkpoint, the block size vLLM's align mode would force, each tier's pool budgets and how
many objects of each kind they hold. With --server: what a running cache server holds (by
model, tier and kind) and its hit rates."""

INSPECT_EXAMPLES = """\
examples:
  hybrid-connector inspect --config configs/vllm.yaml --model qwen3.5-4b
  hybrid-connector inspect --model nemotron-h-8b --tp 2
  hybrid-connector inspect --server hc://127.0.0.1:65432"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("inspect", help="object sizes, vLLM block size and pool capacities of a config",
                       description=INSPECT_HELP, epilog=INSPECT_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML config (default: HYBRID_CONNECTOR_CONFIG or defaults)")
    p.add_argument("--model", default=None,
                   help=f"preset ({', '.join(PRESETS)}) or geometry YAML (default: config.model or qwen3.5-4b)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size override")
    p.add_argument("--server", default=None, help="hc://host:port: inspect a running cache server")
    p.add_argument("--token", default=None, help="the server's token, if it requires one")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.server:
        from hybrid_connector.remote.client.admin import stats
        from hybrid_connector.remote.client.connection import ServerRefused, ServerUnavailable

        try:
            print(server_report(stats(args.server, args.token)))
        except (ServerUnavailable, ServerRefused, ValueError) as exc:
            print(f"hybrid-connector inspect: {args.server}: {exc}")
            return 1
        return 0
    cfg = load_config(args.config)
    geo = load_geometry(args.model or cfg.model or "qwen3.5-4b", tp_size=args.tp)
    print(report(cfg, geo))
    return 0
