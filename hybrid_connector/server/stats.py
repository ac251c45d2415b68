"""What a server holds and how it is used: per model, per kind and tier (``STATS``, the
HTTP ``/stats`` endpoint, the Prometheus collector and ``hybrid-connector inspect``)."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from hybrid_connector.server.models import Models
from hybrid_connector.server.plain import PlainObjects
from hybrid_connector.server.sessions import Sessions
from hybrid_connector.tiers.store import ObjectStore

STARTED = time.time()
PLAIN_PREFIX = "lmc-"  # server.plain's fingerprints


def held(store: ObjectStore) -> dict[str, dict[str, dict[str, list[int]]]]:
    """fingerprint -> tier -> kind -> [objects, bytes] of what the ledger holds (ready)."""
    out: dict[str, dict[str, dict[str, list[int]]]] = {}
    with store.lock:
        entries = list(store.ledger.entries.values())
        shared = store.ledger.shared_tier
    for e in entries:
        if e.pending:
            continue
        tiers = [t for t in (e.tier, shared if e.shared and not e.shared_pending else None) if t]
        for t in tiers:
            cell = out.setdefault(e.key.fingerprint, {}).setdefault(t, {}).setdefault(
                e.key.kind.value, [0, 0])
            cell[0] += 1
            cell[1] += e.nbytes
    return out


def server_stats(store: ObjectStore, served: Models, plain_objects: PlainObjects,
                 sessions: Sessions) -> dict[str, Any]:
    """``StatsReply``'s fields: models (counters, held by tier and kind), plain (LMCache's
    namespaces), tiers (``TierStats``), server (uptime, sessions)."""
    by_fp = held(store)
    models: dict[str, dict[str, Any]] = {}
    for cache in served.caches():
        s = cache.stats
        models[cache.fingerprint] = {
            "name": served.names.get(cache.fingerprint, ""),
            "lookups": s.lookups, "hits": s.hits, "approx_hits": s.approx_hits,
            "prompt_tokens": s.prompt_tokens, "hit_tokens": s.hit_tokens,
            "token_hit_rate": s.token_hit_rate, "request_hit_rate": s.request_hit_rate,
            "stored": dict(s.stored), "rejected": dict(s.rejected), "evicted": dict(s.evicted),
            "load_failures": s.load_failures, "held": by_fp.pop(cache.fingerprint, {}),
        }
    for fp in [f for f in by_fp if not f.startswith(PLAIN_PREFIX)]:
        models[fp] = {"name": "(no client since start)", "held": by_fp.pop(fp)}
    plain = {**plain_objects.stats(), "held": by_fp}  # what is left: LMCache's namespaces
    tiers = {name: asdict(ts) for name, ts in store.stats()["tiers"].items()}
    server = {"uptime_s": time.time() - STARTED, **sessions.counts()}
    return {"models": models, "plain": plain, "tiers": tiers, "server": server}
