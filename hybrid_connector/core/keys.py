"""Chained prefix hashes, object keys and the model fingerprint.

Hashes are blake3 over little-endian int64 token ids chained block by block, so two
processes or machines that see the same tokens derive the same keys (never Python's salted
``hash``). A prefix hash identifies the token prefix ``[0, end)`` for any ``end``: full
blocks are chained, a trailing partial block is hashed onto the last full-block hash.
"""

from __future__ import annotations

import functools
import json
import operator
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import blake3
import numpy as np

HASH_BYTES = 16
ROOT_HASH = bytes(HASH_BYTES)  # hash of the empty prefix
MAX_FINGERPRINT = 256  # characters; model_fingerprint gives 32
MAX_PREFIX_BYTES = 64  # our hashes are 16 bytes; engines' own block hashes up to 64
MAX_POSITION = (1 << 63) - 1  # token positions stay int64
_INT64 = np.dtype(np.int64)  # native byte order
# Printable ASCII without space and without '@' (the field separator of ``to_str``).
_FINGERPRINT_RE = re.compile(r"[!-?A-~]+")


class ObjectKind(StrEnum):
    """The three object kinds, each stored in its own pool."""

    KV = "kv"
    STATE = "state"
    ANCHOR = "anchor"


_MIN = np.minimum.reduce  # ``ndarray.min`` less numpy's Python-level ``_amin`` wrapper


def as_tokens(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """Return ``tokens`` as a contiguous 1-D int64 array (no copy when already one).
    Raises ValueError on a non 1-D input, non-integer values (floats are never truncated
    silently) or negative token ids."""
    if (type(tokens) is np.ndarray and tokens.dtype == _INT64 and tokens.ndim == 1
            and tokens.flags.c_contiguous):  # the common case: what this function returned
        if tokens.size and _MIN(tokens) < 0:  # the ufunc itself: no numpy wrapper frame
            raise ValueError("token ids must be non-negative")
        return tokens
    raw = np.asarray(tokens)
    if raw.size and (raw.dtype == np.bool_ or not np.issubdtype(raw.dtype, np.integer)):
        raise ValueError(f"token ids must be integers, got dtype {raw.dtype}")
    arr = np.ascontiguousarray(raw.astype(np.int64, copy=False))
    if arr.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {arr.shape}")
    if arr.size and int(arr.min()) < 0:
        raise ValueError("token ids must be non-negative")
    return arr


def _h(prev: bytes, block: np.ndarray) -> bytes:
    return blake3.blake3(prev + block.astype("<i8", copy=False).tobytes()).digest(HASH_BYTES)


def chain_hashes(tokens: Sequence[int] | np.ndarray, block_size: int) -> list[bytes]:
    """Hash of every full block prefix: element ``i`` identifies ``tokens[:(i+1)*block_size]``."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    arr = as_tokens(tokens)
    out: list[bytes] = []
    prev = ROOT_HASH
    for start in range(0, arr.size - block_size + 1, block_size):
        prev = _h(prev, arr[start : start + block_size])
        out.append(prev)
    return out


class HasherLike(Protocol):
    """Prefix hashes at any end (``PrefixHasher``, ``hashes.ChainHasher``/``EngineHashes``)."""

    block_size: int

    def at(self, end: int) -> bytes: ...

    def block_ends(self, first: int, end: int) -> tuple[bytes, ...]:
        """``at(p)`` for each block end ``p`` from ``first`` (a block end > 0) to ``end``."""
        ...


class PrefixHasher:
    """Prefix hashes of one token sequence at any end (``hash_at`` over its block chain),
    independent of how the sequence was cut. Immutable; ``at`` raises ValueError outside
    ``[0, len]``."""

    def __init__(self, tokens: Sequence[int] | np.ndarray, block_size: int) -> None:
        self.tokens = as_tokens(tokens)
        self.block_size = block_size
        self.blocks = chain_hashes(self.tokens, block_size)

    def at(self, end: int) -> bytes:
        if not 0 <= end <= self.tokens.size:
            raise ValueError(f"prefix end {end} outside [0, {self.tokens.size}]")
        return hash_at(self.blocks, self.tokens, end, self.block_size)

    def block_ends(self, first: int, end: int) -> tuple[bytes, ...]:
        return at_block_ends(self, first, end)


def at_block_ends(hasher: HasherLike, first: int, end: int) -> tuple[bytes, ...]:
    """``hasher.at(p)`` for each block end ``p`` from ``first`` to ``end``: ``block_ends``
    of a hasher with no faster way to it."""
    return tuple(hasher.at(p) for p in range(first, end + 1, hasher.block_size))


def hash_at(blocks: Sequence[bytes], tokens: np.ndarray, end: int, block_size: int) -> bytes:
    """Hash of ``tokens[:end]`` from ``blocks``, its full blocks' chain (``end`` checked by
    the caller); a partial tail gets its own domain byte, never colliding with a block."""
    nfull = end // block_size
    prev = blocks[nfull - 1] if nfull else ROOT_HASH
    return prev if end % block_size == 0 else _h(prev + b"\x01", tokens[nfull * block_size : end])


def prefix_hash(tokens: Sequence[int] | np.ndarray, end: int, block_size: int) -> bytes:
    """One-off prefix hash of ``tokens[:end]`` (see ``PrefixHasher``)."""
    return PrefixHasher(as_tokens(tokens)[:end], block_size).at(end)


def model_fingerprint(fields: Mapping[str, object]) -> str:
    """Stable hex fingerprint of everything that makes stored bytes model specific.

    ``fields`` is typically ``ModelGeometry.fingerprint_fields()`` plus the engine's layout
    (block size, KV layout). Any change of geometry, dtype or TP size changes it.
    """
    blob = json.dumps(fields, sort_keys=True, default=str).encode()
    return blake3.blake3(blob).hexdigest(length=16)


def epoch_fingerprint(fingerprint: str) -> str:
    """A fingerprint of ``fingerprint``'s model after its weights changed in memory (its
    files, which the fingerprint was made from, still name the old ones): random, so no
    other process, a restart included, ever makes it."""
    return blake3.blake3(f"{fingerprint}:epoch:{secrets.token_hex(16)}".encode()).hexdigest(
        length=16)


@functools.lru_cache(maxsize=64)  # a process sees a handful of fingerprints
def _fingerprint_ok(fp: str) -> bool:
    return 0 < len(fp) <= MAX_FINGERPRINT and _FINGERPRINT_RE.fullmatch(fp) is not None


@dataclass(frozen=True, slots=True)
class ObjectKey:
    """Identity of one stored object: ``(model fingerprint, prefix hash, kind)``.

    ``end`` is the token position the prefix hash identifies (chunk end for KV, the
    checkpoint position for a state, page end for anchors); ``start`` is where a KV chunk
    or anchor page begins (equal to ``end`` for a state). Both are part of the key so a
    partial tail chunk never aliases a full chunk.

    Every field is checked when the key is made, so any key that exists round-trips
    through ``to_str``/``from_str`` (file headers, restarts) and fits a stored header:
    ``fingerprint`` is 1 to ``MAX_FINGERPRINT`` printable ASCII characters without spaces
    or ``@`` (the ``to_str`` separator); ``prefix`` is ``bytes`` of at most
    ``MAX_PREFIX_BYTES``; ``kind`` is an ``ObjectKind``; ``start`` and ``end`` are integers
    (numpy integers become ints, bools are refused) with ``0 <= start <= end <=
    MAX_POSITION``. Anything else raises ValueError naming the field.
    """

    fingerprint: str
    prefix: bytes
    kind: ObjectKind
    start: int
    end: int
    # Cached: keys are hashed at every index and ledger step. Never pickled (``__reduce__``):
    # str hashes differ between processes.
    _hash: int = field(default=0, init=False, repr=False, compare=False)
    _fields: tuple[Any, ...] = field(default=(), init=False, repr=False, compare=False)

    def __init__(self, fingerprint: str, prefix: bytes, kind: ObjectKind, start: int,
                 end: int) -> None:
        # by hand, not the dataclass's: keys are made per chunk at every save and lookup
        put = object.__setattr__
        put(self, "fingerprint", fingerprint)
        put(self, "prefix", prefix)
        put(self, "kind", kind)
        put(self, "start", start)
        put(self, "end", end)
        if not (type(start) is int and type(end) is int and 0 <= start <= end <= MAX_POSITION
                and type(prefix) is bytes and len(prefix) <= MAX_PREFIX_BYTES
                and type(kind) is ObjectKind and type(fingerprint) is str
                and _fingerprint_ok(fingerprint)):
            self._check()  # the slow path: raises, or makes numpy integer positions plain ints
        fields = (fingerprint, prefix, kind, self.start, self.end)
        put(self, "_fields", fields)
        put(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not ObjectKey:
            return NotImplemented
        return self._fields == other._fields

    def __reduce__(self) -> tuple[Any, ...]:
        return ObjectKey, (self.fingerprint, self.prefix, self.kind, self.start, self.end)

    def _check(self) -> None:
        fp = self.fingerprint
        if not (type(fp) is str and _fingerprint_ok(fp)):
            shown = fp[:40] + "..." if isinstance(fp, str) and len(fp) > 40 else fp
            raise ValueError(f"key fingerprint {shown!r}: expected 1 to {MAX_FINGERPRINT} "
                             "printable ASCII characters without spaces or '@'")
        if not isinstance(self.prefix, bytes) or len(self.prefix) > MAX_PREFIX_BYTES:
            got = (f"{len(self.prefix)} bytes" if isinstance(self.prefix, bytes)
                   else type(self.prefix).__name__)
            raise ValueError(f"key prefix must be bytes of at most {MAX_PREFIX_BYTES}, got {got}")
        if not isinstance(self.kind, ObjectKind):
            raise ValueError(f"key kind must be an ObjectKind, got {self.kind!r}")
        for name in ("start", "end"):
            v = getattr(self, name)
            try:
                if isinstance(v, bool):
                    raise TypeError
                v = operator.index(v)  # exact ints only (numpy ints too, floats refused)
            except TypeError:
                raise ValueError(f"key {name} must be an integer, got {v!r}") from None
            if not 0 <= v <= MAX_POSITION:
                raise ValueError(f"key {name} {v} outside [0, {MAX_POSITION}]")
            object.__setattr__(self, name, v)  # plain int, so equal keys hash alike
        if self.start > self.end:
            raise ValueError(f"key start {self.start} > end {self.end}: bad range")

    def digest(self) -> str:
        """Hex name safe for files and remote stores (depends on every field)."""
        raw = f"{self.fingerprint}|{self.prefix.hex()}|{self.kind.value}|{self.start}|{self.end}"
        return blake3.blake3(raw.encode()).hexdigest(length=20)

    def to_str(self) -> str:
        """Readable, parseable form: ``fp@kind@start@end@prefixhex``."""
        return f"{self.fingerprint}@{self.kind.value}@{self.start}@{self.end}@{self.prefix.hex()}"

    @classmethod
    def from_str(cls, s: str) -> ObjectKey:
        try:
            fp, kind, start, end, prefix = s.split("@")
            return cls(fp, bytes.fromhex(prefix), ObjectKind(kind), int(start), int(end))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"not an object key: {s!r}") from exc
