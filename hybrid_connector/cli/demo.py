"""CPU demo: a lookup/save cycle over a generated multi-turn trace, with verified loads.

Every payload saved is a deterministic function of (kind, start, end, tokens), so each
load can be checked byte for byte against what the engine would have produced; any
mismatch aborts the demo (``CorruptLoad``, exit code 1). Prints hit statistics at the end.
Bad arguments (a size, model or config that does not load) exit with code 2.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from functools import partial
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from hybrid_connector import assemble
from hybrid_connector.core.config import HybridConfig, load_config
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.geometry.presets import load_geometry
from hybrid_connector.runtime.cache import HybridCache
from hybrid_connector.runtime.session import RequestSession
from hybrid_connector.sim.traces import multi_turn_chat
from hybrid_connector.tiers.store import ObjectStore
from hybrid_connector.tree.radix import IntegrityError


class CorruptLoad(RuntimeError):
    """A loaded object differs from what was saved for it."""


def fake_payload(tokens: np.ndarray, kind: ObjectKind, start: int, end: int, nbytes: int) -> torch.Tensor:
    """Deterministic bytes standing in for what a model computes for ``tokens[:end]``."""
    seed = hashlib.blake2b(tokens[:end].tobytes() + f"{kind}{start}".encode(), digest_size=8)
    gen = torch.Generator().manual_seed(int.from_bytes(seed.digest(), "little") >> 1)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)


def run_demo(cfg: HybridConfig, geo: ModelGeometry, store: ObjectStore, records: list[dict[str, Any]],
             progress: bool = True) -> HybridCache:
    """Replay ``records`` through a cache over ``store``; verify every load; return the cache.
    Raises ``CorruptLoad`` for a mismatching load and ``IntegrityError`` for a broken index
    (the cache is closed first)."""
    cache = assemble.cache(cfg, geo, store)
    try:
        _replay(cache, cfg, geo, records, progress)
        cache.check_integrity()
    except BaseException:
        cache.close()
        raise
    return cache


def _replay(cache: HybridCache, cfg: HybridConfig, geo: ModelGeometry,
            records: list[dict[str, Any]], progress: bool) -> None:
    kvb, sb = geo.kv_bytes_per_token(), geo.state_bytes()
    for rec in tqdm(records, desc="requests", disable=not progress):
        prompt = np.asarray(rec["input_tokens"], dtype=np.int64)
        out = np.asarray(rec["output_tokens"], dtype=np.int64)
        s = RequestSession(cache, prompt)
        loaded = s.load()
        if loaded.num_tokens:
            for obj, data in zip(s.plan.kv, loaded.kv, strict=True):
                want = fake_payload(prompt, ObjectKind.KV, obj.ref.start, obj.ref.end, obj.ref.nbytes)
                if not torch.equal(data, want):
                    raise CorruptLoad(f"corrupt KV chunk {obj.ref.key}")
            p = s.hit
            if s.plan.state is not None and (loaded.state is None or not torch.equal(
                    loaded.state, fake_payload(prompt, ObjectKind.STATE, p, p, s.plan.state.ref.nbytes))):
                raise CorruptLoad(f"corrupt state {s.plan.state.ref.key}")
        s.release()

        kv = partial(_kv_of, prompt, kvb)
        s.save_prefill(kv, {q: fake_payload(prompt, ObjectKind.STATE, q, q, sb) for q in s.checkpoints})
        s.extend(out)
        full = s.tokens.copy()
        end = cache.final_checkpoint(int(full.size))
        s.finish(partial(_kv_of, full, kvb),
                 {end: fake_payload(full, ObjectKind.STATE, end, end, sb)} if end else {})


def _kv_of(tokens: np.ndarray, kvb: int, start: int, end: int) -> torch.Tensor:
    return fake_payload(tokens, ObjectKind.KV, start, end, kvb * (end - start))


def format_stats(cache: HybridCache) -> str:
    s = cache.stats
    mib = {k.value: cache.tree.bytes[k] / 2**20 for k in ObjectKind}
    return "\n".join([
        f"requests            {s.lookups}",
        f"request hit rate    {s.request_hit_rate:.1%}  (approximate hits: {s.approx_hits})",
        f"token hit rate      {s.token_hit_rate:.1%}  ({s.hit_tokens} of {s.prompt_tokens} prompt tokens)",
        "stored objects      " + ", ".join(f"{k}={v}" for k, v in s.stored.items()),
        "rejected objects    " + ", ".join(f"{k}={v}" for k, v in s.rejected.items()),
        "evicted MiB         " + ", ".join(f"{k}={v / 2**20:.1f}" for k, v in s.evicted.items()),
        "resident MiB        " + ", ".join(f"{k}={v:.1f}" for k, v in mib.items()),
        f"radix nodes         {len(cache.tree)} ({cache.tree.num_states} with a state)",
        "every loaded object verified byte-identical; integrity check passed",
    ])


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


DEMO_HELP = """\
Run a generated multi-turn chat through the cache on this machine's CPU: each turn looks
its prompt up, loads what hits (checked byte for byte) and saves the rest. Prints the
token and request hit rates, what is stored per kind and how objects moved between tiers.
Exit 1 if a load ever differs from what was saved."""

DEMO_EXAMPLES = """\
examples:
  hybrid-connector demo
  hybrid-connector demo --sessions 8 --turns 10 --host-size 512MiB
  hybrid-connector demo --disk /tmp/hc-nvme --disk-size 4GiB   # add an NVMe tier"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="CPU demo: lookup/save cycle on a generated multi-turn trace",
                       description=DEMO_HELP, epilog=DEMO_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML config (default: built-in demo settings)")
    p.add_argument("--model", default="qwen3.5-0.8b", help="model preset or geometry YAML for object sizes")
    p.add_argument("--sessions", type=_positive, default=24, help="conversations (default 24)")
    p.add_argument("--turns", type=_positive, default=6, help="turns per conversation (default 6)")
    p.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")
    p.add_argument("--host-size", default="2GiB", help="host pool total (90%% one budget KV and states share, 10%% anchors)")
    p.add_argument("--disk", help="directory for an NVMe tier below host memory")
    p.add_argument("--disk-size", default="8GiB", help="NVMe tier total (with --disk)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hybrid_connector.tiers.manager import build_store

    over: dict[str, Any] = {"chunk_size": 256, "alignment": 16}
    if not args.config:
        over["max_local_cpu_size"] = args.host_size
        if args.disk:
            over.update(local_disk=args.disk, max_local_disk_size=args.disk_size)
    cfg = load_config(args.config, overrides=over)  # a ConfigError exits 2 (cli.main)
    try:
        geo = load_geometry(args.model)
    except (OSError, ValueError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    budget = cfg.budget("host")
    store = build_store(cfg)
    records = multi_turn_chat(args.sessions, args.turns, args.seed)
    print(f"model {geo.name}: KV {geo.kv_bytes_per_token()} B/token, "
          f"state checkpoint {geo.state_bytes() / 2**20:.2f} MiB; host pools "
          + (f"KV and state {budget.kinds()['kv'] / 2**20:.0f} MiB shared" if budget.pooled
             else f"KV {budget.kv / 2**20:.0f} MiB, state {budget.state / 2**20:.0f} MiB"))
    try:
        cache = run_demo(cfg, geo, store, records)
    except (CorruptLoad, IntegrityError) as exc:
        print(f"demo: FAILED: {exc}", file=sys.stderr)
        return 1
    print(format_stats(cache))
    st = getattr(store, "stats", None)
    if callable(st):
        moved = st()
        print(f"tier movement       demotions={moved['demotions']} promotions={moved['promotions']} "
              f"drops={moved['drops']}")
    cache.close()
    return 0
