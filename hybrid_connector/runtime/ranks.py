"""Tensor-parallel ranks in their own processes: the messages between the index and the
workers, the worker side (``RankWorker``) and the index side (``RankGather``).

Every rank holds its own shard of every object, under the same key, in tiers of the same
budgets (the geometry's per-rank sizes), and runs the same ops in the same order. So the
ledger stays the one truth for all of them, provided a failure anywhere counts everywhere:

* an op succeeded only if it succeeded on every rank (``RankGather`` ANDs the reports);
  an object whose put failed on one rank is unindexed and its other shards deleted (the
  index emits removals for every rank);
* a load is good only if every rank read its shard; a shard lost on one rank is reported,
  the object unindexed on all, and the engine recomputes the request.

Messages are plain picklable values; an engine integration carries them in its own
channels (vLLM: connector metadata one way, worker output the other).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from hybrid_connector.core.keys import ObjectKey
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.index.cache_index import CacheIndex
from hybrid_connector.index.plan import LoadPlan
from hybrid_connector.index.rebuild import Rebuilt
from hybrid_connector.index.saving import SaveTicket
from hybrid_connector.tiers.executor import Executor
from hybrid_connector.tiers.ops import Op


@dataclass(frozen=True)
class OpBatch:
    """Ops every rank must run, in order, for ticket ``ticket`` (0: ops with no save, such
    as evictions and promotions)."""

    ticket: int
    ops: tuple[Op, ...]
    metas: Mapping[ObjectKey, ObjectMeta] = field(default_factory=dict)


@dataclass(frozen=True)
class OpReport:
    """One rank's results for the ops of one lane of a batch (``indices`` into its ops)."""

    ticket: int
    rank: int
    indices: tuple[int, ...]
    results: tuple[bool, ...]


@dataclass(frozen=True)
class LoadReport:
    """One rank's outcome of reading a plan's shards: ``failed`` could not be read now,
    ``lost`` of those are gone for good (missing, corrupt, short)."""

    plan: int
    rank: int
    failed: tuple[ObjectKey, ...] = ()
    lost: tuple[ObjectKey, ...] = ()


class RankWorker:
    """The worker side of one rank: runs batches on its executor and reads plans."""

    def __init__(self, rank: int, executor: Executor) -> None:
        self.rank = rank
        self.executor = executor

    def run(self, batch: OpBatch, payloads: Mapping[ObjectKey, torch.Tensor],
            send: Callable[[OpReport], None]) -> None:
        """Queue ``batch`` with this rank's shard ``payloads``; ``send`` gets one report per
        lane as soon as that lane's ops ran (on the lane's thread)."""
        def done(indices: list[int], results: list[bool]) -> None:
            send(OpReport(batch.ticket, self.rank, tuple(indices), tuple(results)))

        self.executor.submit(batch.ops, payloads, done=done, metas=batch.metas)

    def load(self, plan_id: int, keys: Sequence[ObjectKey], tiers: Sequence[str | None],
             sizes: Sequence[int]) -> tuple[list[torch.Tensor | None], LoadReport]:
        """Read this rank's shards; a shard of the wrong size counts as lost."""
        got = self.executor.read(keys, tiers)
        failed, lost = [], []
        for i, (k, t) in enumerate(zip(keys, got, strict=True)):
            if t is not None and t.numel() * t.element_size() == sizes[i]:
                continue
            got[i] = None
            failed.append(k)
            if t is not None or self.executor.holder(k) is None:
                lost.append(k)
        return got, LoadReport(plan_id, self.rank, tuple(failed), tuple(lost))


Held = tuple[ObjectKey, int, ObjectMeta | None, str]  # (key, bytes, metadata, tier name)


@dataclass
class _Pending:
    reports: dict[int, tuple[bool, ...]] = field(default_factory=dict)  # rank -> results


class RankGather:
    """The index side: merges the reports of ``world_size`` ranks and applies them to the
    index once every rank reported. Thread safe."""

    def __init__(self, index: CacheIndex, world_size: int) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.index = index
        self.world_size = world_size
        self._tickets: dict[int, SaveTicket] = {}
        self._ops: dict[tuple[int, tuple[int, ...]], _Pending] = {}
        self._loads: dict[int, dict[int, LoadReport]] = {}
        self._held: dict[int, list[Held]] = {}  # rank -> its persistent tiers' inventory
        self._lock = threading.Lock()
        self._next_drain = -1

    def expect(self, ticket: SaveTicket) -> OpBatch:
        """Register a save ticket; returns the batch to send to every rank."""
        with self._lock:
            self._tickets[ticket.id] = ticket
        return OpBatch(ticket.id, ticket.ops, ticket.metas)

    def drained(self) -> OpBatch | None:
        """The ops the index left (evictions, promotions, removals of failed shards) as a
        batch for every rank, or None."""
        ops = self.index.drain()
        if not ops:
            return None
        with self._lock:
            tid, self._next_drain = self._next_drain, self._next_drain - 1
            self._tickets[tid] = SaveTicket(tid, tuple(ops), (), 0, (), 0)
        return OpBatch(tid, tuple(ops))

    def op_report(self, rep: OpReport) -> bool:
        """Record one rank's lane results; once every rank reported that lane, complete it
        in the index with the AND of their results. Returns True when it completed."""
        key = (rep.ticket, rep.indices)
        with self._lock:
            pend = self._ops.setdefault(key, _Pending())
            pend.reports[rep.rank] = rep.results
            if len(pend.reports) < self.world_size:
                return False
            del self._ops[key]
            merged = [all(r[i] for r in pend.reports.values()) for i in range(len(rep.indices))]
            ticket = self._tickets[rep.ticket]
        self.index.complete_save(ticket, list(rep.indices), merged)
        return True

    def forget_ticket(self, ticket: int) -> None:
        """Drop a ticket whose every lane completed (bookkeeping only)."""
        with self._lock:
            self._tickets.pop(ticket, None)

    def load_report(self, plan: LoadPlan, rep: LoadReport) -> tuple[ObjectKey, ...] | None:
        """Record one rank's load outcome; once every rank reported, tell the index what was
        lost anywhere and return the keys that failed on some rank (empty: the hit is good
        on every rank). None until every rank reported."""
        with self._lock:
            got = self._loads.setdefault(rep.plan, {})
            got[rep.rank] = rep
            if len(got) < self.world_size:
                return None
            del self._loads[rep.plan]
        failed = tuple(dict.fromkeys(k for r in got.values() for k in r.failed))
        lost = tuple(dict.fromkeys(k for r in got.values() for k in r.lost))
        if lost:
            self.index.report_load(plan, list(lost))
        return failed

    def inventory(self, rank: int, items: Sequence[Held], verify: bool = True) -> Rebuilt | None:
        """Record what one rank's persistent tiers hold (a warm restart); once every rank
        reported, adopt into the index what all of them hold in the same tier (re-linked
        from its metadata, see ``CacheIndex.adopt``) and remove the rest from every rank, so
        the ranks never diverge. None until every rank reported."""
        with self._lock:
            self._held[rank] = list(items)
            if len(self._held) < self.world_size:
                return None
            held, self._held = self._held, {}
        sets = [{(k, t) for k, _, _, t in its} for its in held.values()]
        common = set.intersection(*sets)
        both = [it for it in held[min(held)] if (it[0], it[3]) in common]
        strays = sorted({kt for s_ in sets for kt in s_ - common}, key=str)
        return self.index.adopt(both, verify, strays)
