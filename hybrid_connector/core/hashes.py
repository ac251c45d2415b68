"""Prefix hashes a save needs, without rehashing what was hashed before.

Anything with ``block_size`` and ``at(end) -> bytes`` (the hash identifying ``tokens[:end]``)
can key a save (``CacheIndex.begin_save(..., hashes=...)``):

* ``ChainHasher``: this project's blake3 chain (identical values to ``keys.PrefixHasher``)
  over a growing sequence. ``append`` hashes only the new tokens' full blocks, so a
  request that saves chunk after chunk pays O(new tokens) per save, never O(prefix).
  Given ``ahead`` (a ``PrefixHasher`` of the sequence it is expected to grow into), it
  takes block hashes from it while its tokens match, and hashes itself past the first
  token that differs: the auto-alpha tuner's twin caches serve one request each, and
  hashing it once instead of once per twin took a fifth of their time.
* ``EngineHashes``: an engine's own chained block hashes (vLLM's ``request.block_hashes``,
  SGLang's page hashes), used as they are. Objects keyed this way only meet objects keyed
  the same way, so the integration puts the scheme into the model fingerprint (``layout``).

Both are cheap to query: O(1) at block ends, O(block) for a position inside a block.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hybrid_connector.core.keys import (
    ROOT_HASH,
    HasherLike,
    PrefixHasher,
    _h,
    as_tokens,
    at_block_ends,
    hash_at,
)

_NO_TOKENS = as_tokens(())
Hashes = HasherLike  # what a save needs from prefix hashes (``keys.PrefixHasher`` too)


class ChainHasher:
    """Prefix hashes of a token sequence that only grows. Not thread safe."""

    def __init__(self, block_size: int, tokens: Sequence[int] | np.ndarray = (),
                 ahead: PrefixHasher | None = None) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self._buf = np.zeros(max(1024, 2 * len(tokens)), dtype=np.int64)
        self._n = 0
        self._blocks: list[bytes] = []  # hash of every full block prefix
        # ``ahead``'s blocks are used while every token so far equals its tokens
        self._ahead = ahead if ahead is not None and ahead.block_size == block_size else None
        self.append(tokens)

    @property
    def tokens(self) -> np.ndarray:
        """The tokens so far (a read-only view; valid until the next ``append``)."""
        view = self._buf[: self._n]
        view.flags.writeable = False
        return view

    def __len__(self) -> int:
        return self._n

    def append(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Extend the sequence; hashes the full blocks the new tokens complete. Raises
        ValueError for bad token ids (see ``keys.as_tokens``)."""
        arr = as_tokens(tokens)
        if not arr.size:
            return
        need = self._n + arr.size
        if need > self._buf.size:
            grown = np.zeros(max(need, 2 * self._buf.size), dtype=np.int64)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n : need] = arr
        if self._ahead is not None and not np.array_equal(arr, self._ahead.tokens[self._n : need]):
            self._ahead = None  # diverged (or grew past it): hash from here on
        self._n = need
        bs = self.block_size
        if self._ahead is not None:  # a prefix of ``ahead``'s tokens: its chain, as is
            self._blocks.extend(self._ahead.blocks[len(self._blocks) : need // bs])
            return
        prev = self._blocks[-1] if self._blocks else ROOT_HASH
        for start in range(len(self._blocks) * bs, need - bs + 1, bs):
            prev = _h(prev, self._buf[start : start + bs])
            self._blocks.append(prev)

    def at(self, end: int) -> bytes:
        """Hash of ``tokens[:end]`` (equal to ``keys.PrefixHasher(tokens).at(end)``);
        ValueError outside ``[0, len]``."""
        if not 0 <= end <= self._n:
            raise ValueError(f"prefix end {end} outside [0, {self._n}]")
        return hash_at(self._blocks, self._buf, end, self.block_size)

    def block_ends(self, first: int, end: int) -> tuple[bytes, ...]:
        return at_block_ends(self, first, end)


class EngineHashes:
    """An engine's chained block hashes: ``hashes[i]`` identifies ``tokens[:(i+1)*block]``.

    ``at(end)`` needs ``end`` at a block end, unless the tokens are given too: a position
    inside a block is then hashed as a partial tail onto the engine's block hash (a
    distinct domain, as in ``keys.PrefixHasher``). Raises ValueError otherwise, and for a
    position past the hashes given."""

    def __init__(self, block_size: int, hashes: Sequence[bytes],
                 tokens: Sequence[int] | np.ndarray | None = None) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        # the common case checked in C (exact bytes, none empty); else the full check
        if not (set(map(type, hashes)) <= {bytes} and all(hashes)):
            bad = next((i for i, h in enumerate(hashes) if not isinstance(h, bytes) or not h),
                       None)
            if bad is not None:
                raise ValueError(f"engine block hash {bad} is not non-empty bytes")
        self.block_size = block_size
        self.hashes = list(hashes)
        self.tokens = as_tokens(tokens) if tokens is not None else None

    def __len__(self) -> int:
        full = len(self.hashes) * self.block_size
        return max(full, self.tokens.size) if self.tokens is not None else full

    def at(self, end: int) -> bytes:
        nfull, tail = divmod(end, self.block_size)
        if not tail and 0 < nfull <= len(self.hashes):
            return self.hashes[nfull - 1]  # a block end: the engine's hash of that block
        if end < 0 or nfull > len(self.hashes) or (tail and self.tokens is None):
            raise ValueError(f"no engine hash for a prefix of {end} tokens "
                             f"({len(self.hashes)} blocks of {self.block_size})")
        toks = self.tokens if self.tokens is not None else _NO_TOKENS
        if end > max(toks.size, nfull * self.block_size):
            raise ValueError(f"prefix end {end} past the {toks.size} tokens given")
        return hash_at(self.hashes, toks, end, self.block_size)

    def block_ends(self, first: int, end: int) -> tuple[bytes, ...]:
        bs = self.block_size
        if end // bs <= len(self.hashes):  # ``at`` of a block end is that block's hash
            return tuple(self.hashes[first // bs - 1:end // bs])
        return at_block_ends(self, first, end)  # raises past them


def continue_hashes(prev: bytes, offset: int, tokens: Sequence[int] | np.ndarray,
                    block_size: int) -> list[tuple[int, bytes]]:
    """The chain continued from ``prev`` (the hash of a prefix of ``offset`` tokens,
    ``offset`` a multiple of ``block_size``) over ``tokens``: ``(position, hash)`` at every
    block end after ``offset`` and at the end (a partial tail hashed as ``PrefixHasher``
    does). Lets a warm restart check that an object's metadata really yields its key."""
    if offset % block_size:
        raise ValueError(f"offset {offset} is not a multiple of the block size {block_size}")
    arr = as_tokens(tokens)
    out: list[tuple[int, bytes]] = []
    h = prev
    full = arr.size - arr.size % block_size
    for s in range(0, full, block_size):
        h = _h(h, arr[s : s + block_size])
        out.append((offset + s + block_size, h))
    if full < arr.size:
        out.append((offset + int(arr.size), _h(h + b"\x01", arr[full:])))
    return out
