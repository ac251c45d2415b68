"""Finding what other instances stored on the shared tier for a prompt, and indexing it.

An index knows only what it saved (or re-linked at a warm restart). Before a lookup, an
instance sharing a remote tier walks the prompt past its own KV reach through the shared
tier's manifests (``hybrid_connector.index.manifests``): at each position the chunk whose tokens
continue the prompt is adopted (a shared-only ledger entry, indexed ready), then the walk
goes on from its end. Then it asks the tier which checkpoints exist at the aligned
positions of the newly covered prefix (one batched ``contains``), deepest first, and
adopts the deepest one (and, with replay, the anchor pages). Everything found is read
later like any object: a copy that turns out gone or bad is unindexed at load.

Nothing here queues ops: what adopting leaves (other models' entries the ledger forgot for
room) comes back as ``Effects`` for the index to issue.

It costs one manifest read per chunk walked and one batched existence check, bounded by a
deadline; an unreachable tier finds nothing and raises nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hybrid_connector.core.hashes import Hashes
from hybrid_connector.core.keys import ObjectKey, ObjectKind, as_tokens
from hybrid_connector.index.hit import kv_chain
from hybrid_connector.index.manifests import decode_record, manifest_name
from hybrid_connector.index.reclaim import Reclaimer
from hybrid_connector.index.state import IndexCore
from hybrid_connector.index.table import Effects


class SharedView(Protocol):
    """What discovery needs of the shared tier (``hybrid_connector.tiers.remote.tier.RemoteTier`` is one)."""

    def records(self, name: str) -> list[bytes]: ...

    def contains(self, keys: Sequence[ObjectKey], pin: bool = False) -> list[bool]: ...


@dataclass(frozen=True)
class Found:
    """What one discovery indexed: KV tokens newly covered, checkpoints and anchors."""

    kv_tokens: int = 0
    states: int = 0
    anchors: int = 0
    seconds: float = 0.0


def discover(ix: IndexCore, reclaim: Reclaimer, shared: SharedView, tokens: np.ndarray,
             hashes: Hashes, deadline_s: float, align: int) -> tuple[Found, Effects]:
    """Index what the shared tier holds for ``tokens`` beyond this index's own reach (see
    the module docstring); ``hashes`` are the prompt's prefix hashes. Returns what was
    found and what adopting it left."""
    t0 = time.monotonic()
    arr = as_tokens(tokens)
    stop = t0 + deadline_s
    with ix.lock:
        m = ix.tree.match_tokens(arr)
        _, reach = kv_chain(m, ix.max_kv_len, ix.table.usable, needs_kv=ix.needs_kv)
    start_reach = pos = reach
    out = Effects()
    while pos < arr.size - 1 and time.monotonic() < stop:
        best = None
        for rec in shared.records(manifest_name(ix.fingerprint, hashes.at(pos))):
            got = decode_record(rec)
            if got is None:
                continue
            key, n, meta = got
            if (key.fingerprint == ix.fingerprint and key.start == pos and key.end <= arr.size
                    and np.array_equal(np.asarray(meta.tokens), arr[pos : key.end])
                    and key.prefix == hashes.at(key.end) and (best is None or key.end > best[0].end)):
                best = (key, n)
        if best is None:
            break
        with ix.lock:
            if best[0] not in ix.table and not _adopt(ix, reclaim, arr, best[0], best[1], out):
                break
        pos = best[0].end
    found_kv = pos - start_reach
    states = _probe_states(ix, reclaim, shared, arr, hashes, pos, align, stop, out)
    return Found(found_kv, states, 0, time.monotonic() - t0), out


def _adopt(ix: IndexCore, reclaim: Reclaimer, arr: np.ndarray, key: ObjectKey,
           nbytes: int, out: Effects) -> bool:
    """Track a shared KV chunk in the ledger and index it (its start must be in the tree);
    what that leaves joins ``out``."""
    pl = ix.ledger.adopt_shared(key, nbytes)
    out += reclaim.apply(pl)
    if pl.tier is None:
        return False
    leaf = ix.tree.extend(ix.node_ending_at(arr, key.start), arr[key.start : key.end])
    ix.attach(leaf, key, nbytes)
    return True


def _probe_states(ix: IndexCore, reclaim: Reclaimer, shared: SharedView, arr: np.ndarray,
                  hashes: Hashes, reach: int, align: int, stop: float, out: Effects) -> int:
    """Adopt the deepest checkpoint the shared tier holds at an aligned position within the
    KV reach (one batched existence check), unless this index has one as deep; what that
    leaves joins ``out``."""
    with ix.lock:
        m = ix.tree.match_tokens(arr)
        have = max((n.depth for n in m.path if n.state is not None and ix.table.usable(n.state.key)),
                   default=0)
    hi = min(reach, arr.size - 1)
    cands = list(range(hi - hi % align, have, -align))
    if not cands or time.monotonic() >= stop:
        return 0
    keys = [ObjectKey(ix.fingerprint, hashes.at(q), ObjectKind.STATE, q, q) for q in cands]
    held = shared.contains(keys)
    key = next((k for k, h in zip(keys, held, strict=True) if h), None)
    if key is None:
        return 0
    with ix.lock:
        if key in ix.table:
            return 0
        pl = ix.ledger.adopt_shared(key, ix.geometry.state_bytes())
        out += reclaim.apply(pl)
        if pl.tier is None:
            return 0
        ix.attach(ix.node_ending_at(arr, key.end), key, ix.geometry.state_bytes())
    return 1
