"""Which vLLM requests may share the index's prefixes: token ids lifted into a namespace.

vLLM's block hash of a prefix mixes in more than its token ids
(``vllm/v1/core/kv_cache_utils.py``, ``generate_block_hash_extra_keys``): the request's
cache salt (tenants that must not share a prefix), its LoRA adapter (whose KV and states
differ for the same ids), each multimodal input's identifier from the block holding its
placeholder on (an image's KV differs behind identical placeholder ids) and its prompt
embeddings. The connector's index is keyed by token ids (its radix tree). So before the
index sees a request's ids, ``Namespace.lift`` moves them above the vocabulary into a
namespace of their own from the first position whose KV depends on one of these: id ``t``
at position ``p`` becomes ``t + ns(p) * 2**TOKEN_BITS``, ``ns`` a 39-bit BLAKE3 digest of
the salt, the adapter (name and path, as vLLM hashes them) and the multimodal inputs
placed at or before ``p`` (identifier and offset), 0 where none applies. Two requests
share a lifted prefix when they share its ids, salt, adapter and every input placed in
it: vLLM's own rule, at token rather than block granularity (ids before an image's offset
stay shared with text-only requests; they precede the image).

Requests with prompt embeddings are not cached (``cacheable``): their ids are
placeholders and the embeddings have no digest the connector could take cheaply. The
scheduler side also serves a hit only when every object it loads is keyed by the
requesting request's own block hash (``owned``), so an input vLLM mixes in that this
module does not know of, or a colliding digest, costs the hit rather than serving another
request's bytes (all but the part below the hit of a KV chunk that runs past it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import blake3
import numpy as np

from hybrid_connector.core.hashes import Hashes
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.index.plan import LoadPlan

#: token ids are lifted below this bound (the largest vocabularies are ~2**18)
TOKEN_BITS = 24
NS_BITS = 39  # lifted ids stay below 2**63 (int64)
_MAX_TOKEN = 1 << TOKEN_BITS


def cacheable(request: Any) -> bool:
    """False for a request whose inputs are prompt embeddings (its ids are placeholders)."""
    return getattr(request, "prompt_embeds", None) is None


def _digest(parts: tuple[Any, ...]) -> int:
    raw = blake3.blake3(repr(parts).encode()).digest(8)
    return (int.from_bytes(raw, "little") % ((1 << NS_BITS) - 1)) + 1  # never 0


@dataclass(frozen=True)
class Namespace:
    """Where a request's ids are lifted: ``starts[i]`` is the first position of segment
    ``i``, lifted by ``offsets[i]`` (``ns * 2**TOKEN_BITS``; 0: not lifted)."""

    starts: np.ndarray
    offsets: np.ndarray

    def lift(self, tokens: np.ndarray, first: int) -> np.ndarray:
        """``tokens`` (int64 ids at positions ``first``, ``first + 1``, ...) lifted. Raises
        ValueError for an id of ``2**TOKEN_BITS`` or more in a lifted segment."""
        if not tokens.size:
            return tokens
        if self.starts.size == 1:  # a salt or an adapter alone (the common case): one offset
            off: np.ndarray | int = int(self.offsets[0])
            checked = tokens
        else:
            pos = np.arange(first, first + tokens.size, dtype=np.int64)
            off = self.offsets[np.searchsorted(self.starts, pos, side="right") - 1]
            checked = tokens[off != 0]  # ids before the first input stay as they are
        if int(checked.max(initial=0)) >= _MAX_TOKEN:
            raise ValueError(f"token id past {_MAX_TOKEN - 1} in a namespaced request")
        return tokens + off


def namespace(request: Any) -> Namespace | None:
    """``request``'s namespace (a vLLM ``Request``), or None when its ids are not lifted
    (no salt, adapter or multimodal input: the common case)."""
    salt = getattr(request, "cache_salt", None) or None
    lora = getattr(request, "lora_request", None)
    mm = getattr(request, "mm_features", None)
    if salt is None and not lora and not mm:
        return None
    base: tuple[Any, ...] = (salt, (lora.lora_name, lora.lora_path) if lora else None)
    if not mm:
        return _whole(base)
    features = sorted(mm, key=lambda f: f.mm_position.offset)
    starts, offsets = [0], [0 if base == (None, None) else _digest(base) << TOKEN_BITS]
    placed: tuple[Any, ...] = base
    for f in features:
        at = int(f.mm_position.offset)
        placed = (*placed, (f.identifier, at))
        if at == starts[-1]:
            offsets[-1] = _digest(placed) << TOKEN_BITS
        else:
            starts.append(at)
            offsets.append(_digest(placed) << TOKEN_BITS)
    return Namespace(np.asarray(starts, dtype=np.int64), np.asarray(offsets, dtype=np.int64))


@functools.lru_cache(maxsize=4096)  # tenants and adapters repeat: one digest each
def _whole(base: tuple[Any, ...]) -> Namespace:
    """The namespace of a salt and/or an adapter alone: every position, one offset."""
    return Namespace(np.zeros(1, dtype=np.int64),
                     np.asarray([_digest(base) << TOKEN_BITS], dtype=np.int64))


def lifter(request: Any) -> Callable[[np.ndarray, int], np.ndarray] | None:
    """``namespace(request).lift``, or None when its ids are not lifted."""
    ns = namespace(request)
    return ns.lift if ns is not None else None


def owned(plan: LoadPlan, hashes: Hashes, local: int) -> bool:
    """Whether the objects ``plan`` would load (KV chunks ending past the engine's own
    ``local`` hit, the state) are keyed by ``hashes`` (the requesting request's block
    hashes) at their ends: an input vLLM mixes into its hashes that the namespaces miss
    costs the hit. A KV chunk running past the hit (only its part below the hit is read)
    is not checked: its key covers tokens past the hit, which the request may not share;
    the state at the hit and every chunk below it are."""
    hit = plan.num_tokens
    try:
        return all(o.ref.key.prefix == hashes.at(o.ref.key.end) for o in plan.objects
                   if o.ref.key.end <= hit and (o.ref.key.kind is not ObjectKind.KV
                                                or o.ref.key.end > local))
    except ValueError:  # past the hashes the engine made for the request
        return False
