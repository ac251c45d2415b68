"""What the vLLM connector's scheduler side sends its workers each step, and what they send
back: plain picklable values (vLLM ships them between processes).

Block ids are vLLM's, one list per KV cache group (``KVCacheBlocks.get_block_ids()``); the
worker maps token positions to blocks itself (``vllm_worker``), so a job never carries a
position-to-block table that could disagree with the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.runtime.ranks import Held, LoadReport, OpBatch, OpReport


@dataclass(frozen=True)
class LoadJob:
    """Load a hit of ``end`` tokens into a request whose first ``start`` tokens the engine
    holds already: KV of ``[start, end)`` into the attention groups' blocks, the state at
    ``end`` into block ``end // block_size - 1`` of every recurrent group. ``keys`` (with the
    tier each was planned in and its size per rank) are the plan's objects; an empty
    ``keys`` means the plan could not be leased (its objects went away): the load fails."""

    req_id: str
    job: int
    start: int
    end: int
    keys: tuple[ObjectKey, ...]
    tiers: tuple[str | None, ...]
    sizes: tuple[int, ...]
    block_ids: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class SaveObject:
    """One object of a save: ``kind`` over ``[start, end)`` (a state: ``start == end``);
    ``state_blocks[g]`` is the block of recurrent group ``g`` holding the state."""

    key: ObjectKey
    kind: ObjectKind
    start: int
    end: int
    state_blocks: tuple[tuple[int, int], ...] = ()  # (group id, block id)


@dataclass(frozen=True)
class SaveJob:
    """Copy ``objects`` out of the request's blocks (after this step's forward) and run
    ``batch`` on this rank's tiers with them."""

    req_id: str
    batch: OpBatch
    objects: tuple[SaveObject, ...]
    block_ids: tuple[tuple[int, ...], ...]


@dataclass
class HybridConnectorMetadata(KVConnectorMetadata):
    """One step's work for every worker: loads first (before the forward pass), then saves
    (after it), then ``ops`` (evictions, promotions, removals) with no payload. ``hold``:
    finished requests whose blocks the connector keeps until their saves were copied."""

    loads: list[LoadJob] = field(default_factory=list)
    saves: list[SaveJob] = field(default_factory=list)
    ops: list[OpBatch] = field(default_factory=list)
    hold: list[str] = field(default_factory=list)


@dataclass
class HybridWorkerMetadata(KVConnectorWorkerMetadata):
    """Reports of every rank since the last step (vLLM aggregates the ranks' metadata)."""

    op_reports: list[OpReport] = field(default_factory=list)
    load_reports: list[tuple[int, LoadReport]] = field(default_factory=list)  # (job, report)
    # once per rank, first step: what its persistent tiers hold (a warm restart)
    inventory: list[tuple[int, list[Held]]] = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, HybridWorkerMetadata)
        return HybridWorkerMetadata(self.op_reports + other.op_reports,
                                    self.load_reports + other.load_reports,
                                    self.inventory + other.inventory)
