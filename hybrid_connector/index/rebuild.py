"""Warm restart: re-link the radix index from the metadata stored objects carry.

A persistent tier (NVMe) still holds the previous run's objects; the ledger adopted them
when the store started. Each object carries an ``ObjectMeta``: the prefix hash at its start
(``prev``), its tokens (KV chunks, anchor pages) and the prefix hashes at the block ends
inside it. The chains re-link from the root: a KV chunk whose ``prev`` is the hash of a
position already rebuilt extends the tree there with its tokens; its end and its block ends
become known positions; a checkpoint or an anchor page is attached where its key's prefix
hash is known. For this project's own blake3 keys the chain is checked on the way (the
metadata must hash to the key), so a stale or forged file is never indexed; keys from an
engine's own block hashes cannot be recomputed and are trusted to the tier's checksums.

What cannot be linked (a chain whose start is gone, metadata that does not fit) stays out
of the index; the reclaimer takes it first under budget pressure, oldest first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hybrid_connector.core.hashes import continue_hashes
from hybrid_connector.core.keys import ROOT_HASH, ObjectKey, ObjectKind
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.index.state import IndexCore
from hybrid_connector.index.table import Effects
from hybrid_connector.tree.radix import Node

Item = tuple[ObjectKey, int, ObjectMeta | None]


@dataclass(frozen=True)
class Rebuilt:
    """What a rebuild did: objects indexed by kind, and the keys left out."""

    indexed: dict[str, int]
    unlinked: tuple[ObjectKey, ...]


def relink(ix: IndexCore, items: Iterable[Item], verify: bool = True) -> Rebuilt:
    """Index the ledger's ready objects of this model from their metadata (see the module
    docstring). ``verify``: check that each chunk's tokens hash to its key (this project's
    own blake3 keys). Runs under the index's lock; the tree may already hold objects."""
    bs = ix.config.hash_block_size
    chunks: dict[bytes, list[tuple[ObjectKey, int, ObjectMeta]]] = {}
    ends: list[tuple[ObjectKey, int]] = []  # states, anchor pages: placed by their end hash
    left: list[ObjectKey] = []
    with ix.lock:
        for key, n, meta in items:
            if key.fingerprint != ix.fingerprint or key in ix.table:
                continue
            ready = ix.ledger.where(key) is not None
            if not ready or meta is None or meta.check_key(key) is not None:
                left.append(key)
            elif key.kind is ObjectKind.KV:
                chunks.setdefault(meta.prev, []).append((key, n, meta))
            else:
                ends.append((key, n))
        known: dict[bytes, tuple[Node, int]] = {ROOT_HASH: (ix.tree.root, 0)}
        queue = [ROOT_HASH]
        done = dict.fromkeys(ObjectKind, 0)
        while queue:
            h = queue.pop()
            node, depth = known[h]
            for key, n, meta in chunks.pop(h, []):
                hashes = _chunk_hashes(key, meta, depth, bs, verify)
                if hashes is None:
                    left.append(key)
                    continue
                leaf = ix.tree.extend(_end_node(ix, node, depth), meta.tokens)
                ix.attach(leaf, key, n)
                done[ObjectKind.KV] += 1
                for pos, h in hashes:  # a later chunk may start at any of these positions
                    if h not in known:
                        known[h] = (leaf, pos)
                        queue.append(h)
        for key, n in ends:
            at = known.get(key.prefix)
            if at is None or at[1] != key.end:
                left.append(key)
                continue
            holder = ix.deepest_holder(at[0], key.end)
            if key.kind is ObjectKind.STATE and holder.depth != key.end:
                holder = ix.tree.split(holder, key.end)
            if key.kind is ObjectKind.ANCHOR and (holder.start >= key.end or holder.depth < key.end):
                left.append(key)
                continue
            ix.attach(holder, key, n)
            done[key.kind] += 1
        left += [k for group in chunks.values() for k, _, _ in group]
    return Rebuilt({k.value: v for k, v in done.items()}, tuple(left))


def _end_node(ix: IndexCore, node: Node, depth: int) -> Node:
    """A node ending exactly at ``depth`` on ``node``'s path (split when inside an edge)."""
    holder = ix.deepest_holder(node, depth) if depth else ix.tree.root
    if holder is not ix.tree.root and holder.depth != depth:
        holder = ix.tree.split(holder, depth)
    return holder


def _chunk_hashes(key: ObjectKey, meta: ObjectMeta, depth: int, bs: int,
                  verify: bool) -> list[tuple[int, bytes]] | None:
    """(position, hash) of the chunk's block ends and end, or None when the chunk cannot
    continue the chain at ``depth`` (wrong start, no tokens, a hash that does not match)."""
    if key.start != depth or len(meta.tokens) != key.end - key.start:
        return None
    if verify:
        if meta.block_size != bs or key.start % bs:
            return None  # not this project's chain: cannot be checked, so not trusted
        got = continue_hashes(meta.prev, key.start, meta.tokens, bs)
        return got if got[-1][1] == key.prefix else None
    ends = _block_ends(key.start, key.end, meta.block_size)
    return [*zip(ends, meta.hashes, strict=False), (key.end, key.prefix)]


def _block_ends(start: int, end: int, bs: int) -> list[int]:
    if bs <= 0:
        return []
    first = start - start % bs + bs
    return list(range(first, end + 1, bs))


def adopt_reported(ix: IndexCore, items: Iterable[tuple[ObjectKey, int, ObjectMeta | None, str]],
                   orphans: dict[ObjectKind, list[ObjectKey]], verify: bool = True,
                   strays: Iterable[tuple[ObjectKey, str]] = ()) -> tuple[Rebuilt, Effects]:
    """Warm restart across processes: account what worker processes report their persistent
    tiers hold (``(key, nbytes, meta, tier)``, held on every rank) in the ledger, then
    re-link it (``relink``). An object the ledger has no room for, or of another model,
    is removed from the workers (the ``Remove`` ops returned with what was rebuilt, for the
    index to issue), so the workers' tiers never hold bytes the ledger does not know.
    Mutates the ledger and the index; ``strays``, ``(key, tier)`` some workers hold but not
    all, are removed the same way; adopted keys join ``orphans`` (the reclaimer's queue: reclaimed first, oldest
    first, unless re-linked). Never raises for what the items hold."""
    from hybrid_connector.tiers.ops import Op, Remove

    kept: list[Item] = []
    removes: list[Op] = []
    with ix.lock, ix.ledger.lock:  # adopt-or-remove per item, against one ledger state
        for key, n, meta, tier in items:
            if key.fingerprint == ix.fingerprint and ix.ledger.adopt(key, n, tier):
                kept.append((key, n, meta))
                orphans[key.kind].append(key)
            elif not ix.ledger.knows(key):
                removes.append(Remove(key, tier))
        removes += [Remove(k, t) for k, t in strays]
    return relink(ix, kept, verify), Effects(removes)
