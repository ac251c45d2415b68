"""vLLM KV cache events for what the connector's tiers hold (``take_events``).

vLLM publishes ``BlockStored`` and ``BlockRemoved`` (``vllm/distributed/kv_events.py``) for
its own device blocks and, through a connector's ``take_events``, for the connector's tiers;
KV-cache-aware routers score engines by them. On with vLLM's ``--kv-events-config
'{"enable_kv_cache_events": true, ...}'``; otherwise the index records nothing for it.

* **What is announced:** an object once its put has landed, while the index may serve it
  (``StateTable.usable``), under vLLM's hash of the block its end closes, once per KV cache
  group it fills: a KV chunk for the attention groups, a state for the recurrent groups.
* **Medium:** that of the tier it is read from. Device: ``GPU``; host: ``CPU``; NVMe:
  ``STORAGE``; the shared remote tier: ``STORAGE`` with locality ``REMOTE``.
* **Changes:** a move between tiers is a removal from one medium and a store in the other.
  An eviction, a lost copy or a reset is a removal.
* **Not announced:** objects whose end is not a block boundary (an exact end-of-request
  state, the KV below it). vLLM has no block hash for them.
* **Hybrid models:** a hit needs the KV and every recurrent group's state at one position.
  A router scoring hybrid hits should require every group's hash there, as it does for
  vLLM's own events.

Payloads: by default vLLM's placeholder shape, OffloadingConnector's too (the one hash, no
tokens). With ``"self_describing_kv_events": true`` in ``kv_connector_extra_config`` (the
option OffloadingConnector reads), a store carries every block hash the object closes, the
parent hash, the token ids, the block size and the LoRA adapter. They are copied at save time
and kept while the object is indexed, so their memory is bounded by the tiers' budgets.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    MEDIUM_STORAGE,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)
from vllm.v1.core.kv_cache_utils import BlockHash, maybe_convert_block_hash

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.index.cache_index import CacheIndex
from hybrid_connector.integrations.vllm.meta import SaveObject
from hybrid_connector.integrations.vllm.setup import connector_extra

# tier name (``tiers.configured.tier_specs``) -> (medium, locality)
MEDIA: dict[str, tuple[str, str | None]] = {
    "device": (MEDIUM_GPU, None), "host": (MEDIUM_CPU, None),
    "nvme": (MEDIUM_STORAGE, "LOCAL"), "remote": (MEDIUM_STORAGE, "REMOTE")}


@dataclass(frozen=True, slots=True)
class Payload:
    """A stored object's self-describing event fields (vLLM's ``BlockStored``)."""

    block_hashes: tuple[Any, ...]
    parent: Any
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None
    lora_name: str | None


def _hash(h: bytes) -> Any:
    return maybe_convert_block_hash(BlockHash(h))


class KvEvents:
    """The connector's KV events (module docstring). ``groups[kind]``: the KV cache groups
    an object of that kind fills; ``kinds``: group id -> vLLM's ``kv_cache_spec_kind``;
    ``block_size``: vLLM's block; ``hash_block``: the tokens per entry of a request's
    ``block_hashes``. The engine-core thread only."""

    def __init__(self, index: CacheIndex, groups: Mapping[ObjectKind, tuple[int, ...]],
                 kinds: Mapping[int, str | None], block_size: int, hash_block: int,
                 self_describing: bool = False) -> None:
        self.index = index
        self.groups, self.kinds = dict(groups), dict(kinds)
        self.bs, self.hb, self.self_describing = block_size, hash_block, self_describing
        self._published: dict[ObjectKey, str] = {}  # key -> the tier it was announced in
        self._payloads: dict[ObjectKey, Payload] = {}
        with index.lock:
            index.table.watch()

    def describe(self, request: Any, objects: Iterable[SaveObject]) -> None:
        """Copy the self-describing fields of ``objects``, about to be saved for
        ``request`` (nothing unless self-describing)."""
        if not self.self_describing:
            return
        bs, hb, hashes, lora = self.bs, self.hb, request.block_hashes, request.lora_request
        for o in objects:
            if o.end % bs or o.key in self._payloads or len(hashes) < o.end // hb:
                continue  # no block hash (yet): the placeholder payload
            first = (o.start // bs + 1) * bs if o.kind is ObjectKind.KV else o.end
            ends = range(first, o.end + 1, bs)
            begin = first - bs
            self._payloads[o.key] = Payload(
                tuple(_hash(hashes[e // hb - 1]) for e in ends),
                _hash(hashes[begin // hb - 1]) if begin > 0 else None,
                tuple(request.all_token_ids[begin:o.end]), bs,
                lora.adapter_id if lora is not None else None,
                lora.name if lora is not None else None)

    def take(self) -> list[KVCacheEvent]:
        """The events since the last call: every removal before every store, so a hash
        that changed hands within the step (a chunk replacing a shorter one with its end, a
        move between tiers) ends announced."""
        ix = self.index
        table = ix.table
        with ix.lock:
            now = {k: ((ix.ledger.where(k) if table.usable(k) else None), k in table)
                   for k in table.take_changes()}
        gone: list[KVCacheEvent] = []
        new: list[KVCacheEvent] = []
        for key, (tier, indexed) in now.items():
            prev = self._published.get(key)
            if tier != prev and key.end % self.bs == 0:
                if prev is not None:
                    gone += self._removed(key, prev)
                    del self._published[key]
                if tier is not None:
                    new += self._stored(key, tier)
                    self._published[key] = tier
            if not indexed:
                self._payloads.pop(key, None)
        return gone + new

    def _payload(self, key: ObjectKey) -> Payload:
        """``key``'s self-describing fields, else vLLM's placeholder: its one block hash."""
        return self._payloads.get(key) or Payload((_hash(key.prefix),), None, (), 0, None, None)

    def _stored(self, key: ObjectKey, tier: str) -> list[KVCacheEvent]:
        medium, locality = MEDIA.get(tier, (MEDIUM_CPU, None))
        p = self._payload(key)
        return [BlockStored(block_hashes=list(p.block_hashes), parent_block_hash=p.parent,
                            token_ids=list(p.token_ids), block_size=p.block_size,
                            lora_id=p.lora_id, medium=medium, lora_name=p.lora_name,
                            group_idx=g, kv_cache_spec_kind=self.kinds.get(g),
                            locality=locality)
                for g in self.groups.get(key.kind, ())]

    def _removed(self, key: ObjectKey, tier: str) -> list[KVCacheEvent]:
        medium, locality = MEDIA.get(tier, (MEDIUM_CPU, None))
        hashes = list(self._payload(key).block_hashes)
        return [BlockRemoved(block_hashes=hashes, medium=medium, group_idx=g, locality=locality)
                for g in self.groups.get(key.kind, ())]


def kv_events(vllm_config: Any, kv_cache_config: Any, index: CacheIndex, groups: Any,
              hash_block: int) -> KvEvents | None:
    """The connector's ``KvEvents`` when vLLM publishes KV events (``--kv-events-config``'s
    ``enable_kv_cache_events``), else None. ``groups``: ``setup.Groups``."""
    from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind

    ec = vllm_config.kv_events_config
    if ec is None or not ec.enable_kv_cache_events:
        return None
    kinds = {i: get_kv_cache_spec_kind(g.kv_cache_spec).value
             for i, g in enumerate(kv_cache_config.kv_cache_groups)}
    fills = {ObjectKind.KV: tuple(sorted({g for g, _ in groups.attention})),
             ObjectKind.STATE: tuple(groups.recurrent_groups)}
    return KvEvents(index, fills, kinds, groups.block_size, hash_block,
                    bool(connector_extra(vllm_config).get("self_describing_kv_events", False)))
