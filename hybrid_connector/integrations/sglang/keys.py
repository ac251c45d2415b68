"""SGLang HiCache vocabulary without SGLang: page-hash keys and the per-pool hit rule.

Nothing here imports SGLang (``integrations/sglang.py`` is the only module that does), so
the rules below are plain functions over strings and booleans.

Keys (``PageKeys``). SGLang names every L3 object by a chained page hash (a string, a
SHA-256 hex digest in 0.5.23), often without the token ids; a MAMBA state is named by the
hash of the last KV page it covers. A page hash therefore becomes the ``prefix`` of an
``ObjectKey`` as it is, without rehashing: a hex string is decoded to its bytes, any other
string is taken as UTF-8, and a one-byte tag (``h``/``t``) keeps the two forms apart. Token
positions are not part of SGLang's names (the chain already identifies the prefix), so
every key uses the fixed range ``[0, page_size)`` for KV and ``[0, 0]`` for a state. The
pool decides the ``ObjectKind`` (KV -> KV, MAMBA -> STATE, each in its own tier pool) and
the fingerprint, which holds the engine, the key scheme, the model, the rank shard and the
host-pool layout (bytes written in one layout never load into another).

Hits (``restorable_prefixes``): SGLang's ``batch_exists_v2`` contract. The KV pool gives
the longest run of present pages; each extra pool then keeps the prefix lengths it can
restore: ``all_pages`` needs every page up to the length, ``trailing_pages`` only the last
``n`` (a MAMBA state at the last page). The usable hit is the largest length every pool
can restore.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from hybrid_connector.core.keys import MAX_PREFIX_BYTES, ObjectKey, ObjectKind, model_fingerprint

KV_POOL = "kv"
MAMBA_POOL = "mamba"
POOL_KINDS: Mapping[str, ObjectKind] = {KV_POOL: ObjectKind.KV, MAMBA_POOL: ObjectKind.STATE}
ALL_PAGES = "all_pages"
TRAILING_PAGES = "trailing_pages"
KEY_SCHEME = "sglang-page-hash-v1"

_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")


def hash_bytes(page_hash: str) -> bytes:
    """The ``ObjectKey.prefix`` of an SGLang page hash (no rehashing; injective).

    Raises ValueError for a non-string, an empty string or one whose bytes exceed
    ``MAX_PREFIX_BYTES - 1`` (126 hex characters, 63 UTF-8 bytes otherwise)."""
    if not isinstance(page_hash, str) or not page_hash:
        raise ValueError(f"SGLang page hash must be a non-empty string, got {page_hash!r}")
    raw = (b"h" + bytes.fromhex(page_hash) if _HEX.fullmatch(page_hash)
           else b"t" + page_hash.encode())
    if len(raw) > MAX_PREFIX_BYTES:
        raise ValueError(f"SGLang page hash {page_hash[:40]!r}... is longer than "
                         f"{MAX_PREFIX_BYTES - 1} bytes; this key scheme cannot hold it")
    return raw


class PageKeys:
    """Object keys of SGLang page hashes, per pool, for one rank.

    ``shard`` names what makes a rank's bytes its own (tp/pp/cp ranks and sizes);
    ``kv_replicated`` (MLA) leaves the tp rank out of KV keys, since every rank holds the
    same KV, while states stay per rank (they are TP-sharded)."""

    def __init__(self, model: str, page_size: int, layout: str,
                 shard: Mapping[str, int], kv_replicated: bool = False) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.page_size = page_size
        base = {"engine": "sglang", "keys": KEY_SCHEME, "model": model, "layout": layout,
                "page_size": page_size}
        kv_shard = {k: v for k, v in shard.items() if not (kv_replicated and k == "tp_rank")}
        self.fingerprints = {
            KV_POOL: model_fingerprint({**base, "pool": KV_POOL, **kv_shard}),
            MAMBA_POOL: model_fingerprint({**base, "pool": MAMBA_POOL, **shard}),
        }

    def supports(self, pool: str) -> bool:
        """Whether ``pool`` (a ``PoolName`` value) is stored by this backend."""
        return pool in POOL_KINDS

    def key(self, pool: str, page_hash: str) -> ObjectKey:
        """The key of ``page_hash`` in ``pool``; ValueError for an unsupported pool or a bad
        hash (see ``hash_bytes``)."""
        kind = POOL_KINDS.get(pool)
        if kind is None:
            raise ValueError(f"pool {pool!r} is not stored (supported: {sorted(POOL_KINDS)})")
        end = self.page_size if kind is ObjectKind.KV else 0
        return ObjectKey(self.fingerprints[pool], hash_bytes(page_hash), kind, 0, end)


    def state_of(self, kv_key: ObjectKey) -> ObjectKey:
        """The MAMBA state keyed by the same page hash as ``kv_key``: the state at the end
        of that page, which cannot be restored without it."""
        return ObjectKey(self.fingerprints[MAMBA_POOL], kv_key.prefix, ObjectKind.STATE, 0, 0)


def leading(present: Sequence[bool]) -> int:
    """Length of the leading run of True."""
    return next((i for i, ok in enumerate(present) if not ok), len(present))


def pool_restorable(present: Sequence[bool], policy: str, trailing: int) -> set[int]:
    """Prefix lengths (pages, 1-based) one extra pool can restore, given which of the
    KV-hit pages it holds. ``all_pages``: lengths up to its leading run; ``trailing_pages``:
    lengths whose last ``trailing`` pages it holds. ValueError for any other policy."""
    if policy == ALL_PAGES:
        return set(range(1, leading(present) + 1))
    if policy == TRAILING_PAGES:
        n = max(1, trailing)
        return {p for p in range(1, len(present) + 1) if all(present[max(0, p - n):p])}
    raise ValueError(f"unsupported pool hit policy {policy!r}")


def restorable_prefixes(kv_present: Sequence[bool],
                        pools: Sequence[tuple[str, str, int, Sequence[bool]]]
                        ) -> tuple[int, dict[str, int], list[int]]:
    """The ``batch_exists_v2`` answer: ``(usable pages, per-pool boundary, restorable
    lengths)``. ``pools`` holds ``(name, policy, trailing, present)`` per extra pool, with
    ``present`` covering at least the KV run. A pool whose policy is unsupported restores
    nothing (the hit is 0), never an error."""
    kv_pages = leading(kv_present)
    hits: dict[str, int] = {KV_POOL: kv_pages} if kv_pages else {}
    restorable = set(range(1, kv_pages + 1))
    for name, policy, trailing, present in pools:
        if not restorable:
            break
        try:
            ok = pool_restorable(list(present[:kv_pages]), policy, trailing)
        except ValueError:
            ok = set()
        if ok:
            hits[name] = max(ok)
        restorable &= ok
    order = sorted(restorable)
    return (order[-1] if order else 0), hits, order
