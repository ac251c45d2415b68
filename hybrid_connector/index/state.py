"""The state a ``CacheIndex`` shares with its halves (``Reclaimer``, ``Saver``, discovery,
rebuild): the tree, the ledger and the policies (``IndexCore``), and the per-key
bookkeeping in a ``StateTable`` (``hybrid_connector.index.table``, its one owner). The
halves return what they leave (``Effects``); ``IndexCore.issue`` queues it. See
``hybrid_connector.index.cache_index`` for the contracts; nothing here takes a decision.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.keys import ObjectKey, ObjectKind, model_fingerprint
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.table import Effects, Lease, StateTable
from hybrid_connector.policies.base import AdmissionPolicy, EvictionPolicy
from hybrid_connector.tiers.backend import Backend
from hybrid_connector.tiers.ops import Op
from hybrid_connector.tree.radix import Node, ObjectRef, RadixTree

__all__ = ["CacheStats", "Effects", "IndexCore", "Lease", "Policies", "StateTable",
           "check_alignment"]


class Policies(NamedTuple):
    """The policies an index runs (built by ``hybrid_connector.assemble``)."""

    eviction: EvictionPolicy
    admission: AdmissionPolicy


@dataclass
class CacheStats:
    """Running counters (mutable, owned by the index; copy before publishing)."""

    lookups: int = 0
    hits: int = 0
    approx_hits: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    stored: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in ObjectKind})
    rejected: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in ObjectKind})
    evicted: dict[str, int] = field(default_factory=lambda: {k.value: 0 for k in ObjectKind})
    load_failures: int = 0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def request_hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


def check_alignment(alignment: int) -> int:
    """``alignment`` if it is a positive int, else ValueError."""
    if isinstance(alignment, bool) or not isinstance(alignment, int | np.integer) or alignment <= 0:
        raise ValueError(f"alignment must be a positive integer, got {alignment!r}")
    return int(alignment)


class IndexCore:
    """The shared state of one index (see ``CacheIndex``). Mutated only under ``lock``; the
    per-key bookkeeping lives in ``table`` (``StateTable``), its only writer."""

    def __init__(self, config: HybridConfig, geometry: ModelGeometry, backend: Backend,
                 policies: Policies, layout: dict[str, object] | None = None,
                 model_id: str = "") -> None:
        self.config = config
        self.geometry = geometry
        self.backend = backend
        self.ledger = backend.ledger
        self.table = StateTable(max_kv_len=config.chunk_size)
        self.tree = RadixTree(on_move=self.table.moved)
        self.fingerprint = model_fingerprint(
            {**geometry.fingerprint_fields(), "chunk": config.chunk_size,
             "hash_block": config.hash_block_size, "model_id": model_id, **(layout or {})})
        self.retired: set[str] = set()  # earlier epochs' fingerprints (``CacheIndex.clear``)
        self.needs_state = bool(geometry.recurrent_layers)
        self.needs_kv = bool(geometry.attention_layers)  # False: a state-only model
        self.eviction, self.admission = policies
        self.stats = CacheStats()
        self.lock = threading.RLock()
        self.clock = 0.0

    # ---------------------------------------------------------------- views
    # Read-only views for callers outside the index (tests, the server's model registry).
    @property
    def where(self) -> Mapping[ObjectKey, int]:
        """Indexed key -> id of the node holding its ref (a read-only view)."""
        return self.table.placement()

    @property
    def pending(self) -> frozenset[ObjectKey]:
        return self.table.pending_keys()

    @property
    def doomed(self) -> frozenset[ObjectKey]:
        return self.table.doomed_keys()

    @property
    def leases(self) -> Mapping[int, Lease]:
        return self.table.active_leases()

    @property
    def max_kv_len(self) -> int:
        return self.table.max_kv_len

    # ---------------------------------------------------------------- state
    def issue(self, effects: Effects) -> None:
        """Queue what a change left: its ops for ``drain``, its foreign drops for
        ``deliver_foreign_drops`` (index lock held)."""
        self.table.queue(effects.ops)
        self.table.queue_foreign(effects.foreign)

    def drain(self) -> list[Op]:
        """Take the ops the last calls left for the workers (run them in order)."""
        with self.lock:
            return self.table.take_ops()

    def deliver_foreign_drops(self) -> None:
        """Tell other indexes on the backend about their objects our placement dropped
        (outside our lock: their callbacks take their own)."""
        with self.lock:
            keys = self.table.take_foreign()
        if keys:
            self.backend.report_dropped(keys)

    def owns(self, fingerprint: str) -> bool:
        """Is ``fingerprint`` this index's, now or in an earlier epoch (a put in flight at
        ``clear(new_epoch=True)`` still carries that one)?"""
        return fingerprint == self.fingerprint or fingerprint in self.retired

    def _alignment(self, alignment: int | None) -> int:
        return check_alignment(self.config.alignment if alignment is None else alignment)

    def final_checkpoint(self, num_tokens: int, alignment: int | None = None) -> int:
        """Where the end-of-request checkpoint must be taken to be usable: the last aligned
        position at or before ``num_tokens`` (an unaligned state can never hit)."""
        align = self._alignment(alignment)
        return num_tokens - num_tokens % align

    def deepest_holder(self, node: Node, p: int) -> Node:
        """The node on ``node``'s path whose edge holds position p (``0 < p <= depth``)."""
        cur = node
        while cur.parent is not None and cur.start >= p:
            cur = cur.parent
        return cur

    def _node(self, node_id: int) -> Node:
        node = self.tree.node(node_id)
        if node is None:
            raise KeyError(f"node {node_id} is gone while locked (bookkeeping bug)")
        return node

    def attach(self, node: Node, key: ObjectKey, nbytes: int,
               pending: bool = False) -> ObjectRef | None:
        """Index ``key`` at ``node``, whose edge holds its end (a state: ends there): an
        object already stored (a warm restart, another instance's on the shared tier), or
        (``pending``) one just placed, its put in flight. Returns the KV chunk it replaced
        (same end, covering less), which the caller forgets; else None."""
        ref = ObjectRef(key, nbytes)
        old = None
        if key.kind is ObjectKind.KV:
            old = self.tree.add_kv(node, ref)
        elif key.kind is ObjectKind.STATE:
            self.tree.set_state(node, ref)
        else:
            self.tree.add_anchor(node, ref)
        if pending:
            self.table.index_pending(key, node.id)
        else:
            self.table.index_ready(key, node.id)
        self.eviction.on_change(node)
        return old if old is not None and old.key != key else None

    def node_ending_at(self, tokens: np.ndarray, pos: int) -> Node:
        """A node ending exactly at ``pos`` of ``tokens`` (split off when ``pos`` falls
        inside an edge); ``tokens[:pos]`` must be in the tree."""
        m = self.tree.match(tokens[:pos])
        if m.length < pos:
            raise KeyError(f"prefix of {pos} tokens is not in the tree")
        holder = m.partial if m.partial is not None else m.node
        if holder is not self.tree.root and holder.depth != pos:
            holder = self.tree.split(holder, pos)
        return holder
