"""Shared helpers for the cache tests: a tiny hybrid geometry whose objects are a few bytes,
payloads of exactly the geometry's sizes that remember the prefix they were made for, and
cache builders over a ``MemoryStore``.

A payload's bytes are a deterministic function of (prefix tokens, kind, start), and
``SAVED`` maps them back to that prefix, so a test can prove that a loaded object was made
for exactly the query's prefix (``made_for``).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from hybrid_connector import assemble
from hybrid_connector.core.config import load_config
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.plan import SaveItem
from hybrid_connector.policies.admission.anchors import anchor_block_bytes
from hybrid_connector.runtime.cache import HybridCache
from hybrid_connector.tiers.memory import MemoryStore

# One GDN layer and one attention layer: KV 16 B/token, a checkpoint of 28 B.
TINY = ModelGeometry.from_dict({
    "name": "tiny-hybrid", "architecture": "qwen3_5_text", "hidden_size": 8, "vocab_size": 64,
    "layers": ["gdn+mlp", "attention+mlp"],
    "attention": {"num_heads": 1, "num_kv_heads": 1, "head_dim": 4},
    "gdn": {"num_k_heads": 1, "num_v_heads": 1, "head_k_dim": 2, "head_v_dim": 2,
            "conv_kernel": 2},
    "mlp": {"intermediate_size": 16},
})
# The same attention without recurrent layers (every KV prefix is a hit).
TINY_ATTN = ModelGeometry.from_dict({
    **{k: v for k, v in TINY.to_dict().items() if k != "gdn"},
    "name": "tiny-attention", "layers": ["attention+mlp", "attention+mlp"],
})
CHUNK = 8
ALIGN = 4
PAGE = 4

SAVED: dict[bytes, tuple[int, ...]] = {}  # payload bytes -> the token prefix it was made for


def nbytes(geo: ModelGeometry, kind: ObjectKind, start: int, end: int,
           page: int = PAGE, density: float = 0.25) -> int:
    if kind is ObjectKind.KV:
        return (end - start) * geo.kv_bytes_per_token()
    if kind is ObjectKind.STATE:
        return geo.state_bytes()
    return anchor_block_bytes(geo, page, density)


def payload(tokens, kind: ObjectKind, start: int, end: int, geo: ModelGeometry = TINY,
            size: int | None = None) -> torch.Tensor:
    """Bytes unique to (prefix, kind, start), of the geometry's size for that object."""
    prefix = tuple(int(t) for t in np.asarray(tokens)[:end])
    n = nbytes(geo, kind, start, end) if size is None else size
    seed = hashlib.blake2b(repr((prefix, kind.value, start)).encode(), digest_size=8).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(seed, "little") >> 1)
    out = torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8)
    SAVED[out.numpy().tobytes()] = prefix
    return out


def made_for(data: torch.Tensor, query, upto: int) -> bool:
    """``data`` was saved for a prefix that agrees with ``query`` on ``[0, upto)``."""
    prefix = SAVED.get(data.contiguous().view(torch.uint8).numpy().tobytes())
    q = tuple(int(t) for t in np.asarray(query)[:upto])
    return prefix is not None and len(prefix) >= upto and prefix[:upto] == q


def config(**over):
    return load_config(overrides={"chunk_size": CHUNK, "hash_block_size": 4, "alignment": ALIGN,
                                  "anchor_page_size": PAGE, **over}, environ={})


def memory_store(kv=10**6, state=10**6, anchor=10**6) -> MemoryStore:
    return MemoryStore({ObjectKind.KV: kv, ObjectKind.STATE: state, ObjectKind.ANCHOR: anchor})


def make_cache(kv=10**6, state=10**6, anchor=10**6, geo: ModelGeometry = TINY, store=None,
               **over) -> HybridCache:
    return assemble.cache(config(**over), geo, store or memory_store(kv, state, anchor))


def kv_items(toks, start: int, upto: int, geo: ModelGeometry = TINY,
             cuts=()) -> list[SaveItem]:
    """KV chunks ``[start, upto)`` at multiples of CHUNK, also cut at ``cuts``."""
    bounds = sorted({*range(start, upto, CHUNK), *(c for c in cuts if start < c < upto), upto})
    return [SaveItem(ObjectKind.KV, s, e, payload(toks, ObjectKind.KV, s, e, geo))
            for s, e in zip(bounds, bounds[1:], strict=False)]


def state_item(toks, p: int, geo: ModelGeometry = TINY) -> SaveItem:
    return SaveItem(ObjectKind.STATE, p, p, payload(toks, ObjectKind.STATE, p, p, geo))


def anchor_item(toks, start: int, end: int, geo: ModelGeometry = TINY) -> SaveItem:
    return SaveItem(ObjectKind.ANCHOR, start, end, payload(toks, ObjectKind.ANCHOR, start, end, geo))


def save_seq(cache: HybridCache, toks, states, kv_upto: int | None = None):
    toks = np.asarray(toks)
    upto = len(toks) if kv_upto is None else kv_upto
    geo = cache.geometry
    items = kv_items(toks, 0, upto, geo) + [state_item(toks, p, geo) for p in states]
    return cache.save(toks, items)
