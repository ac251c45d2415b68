"""``ObjectMeta``: what a stored object carries so an index can re-link it after a restart
(its start hash, tokens and chain hashes), checked when made and stored compactly."""

from __future__ import annotations

import functools
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybrid_connector.core.keys import (
    MAX_POSITION,
    MAX_PREFIX_BYTES,
    HasherLike,
    ObjectKey,
    ObjectKind,
    as_tokens,
)

MAX_META_TOKENS = 1 << 20
MAX_META_HASHES = 1 << 16
MAX_META_BLOCK = MAX_POSITION
# version, len(prev), hash length (VAR_HASH: each hash carries a length byte), token width
# in bytes (0, 2, 4 or 8), block_size, number of tokens, number of hashes
_META_HEAD = struct.Struct("<BBBBQII")
_META_VERSION = 1
_VAR_HASH = 0xFF
_WIDTH_CODE = {2: "H", 4: "I", 8: "Q"}
MAX_META_BYTES = (_META_HEAD.size + MAX_PREFIX_BYTES + 8 * MAX_META_TOKENS
                  + (1 + MAX_PREFIX_BYTES) * MAX_META_HASHES)


_struct = functools.lru_cache(maxsize=64)(struct.Struct)  # formats of the meta fields


def _meta_seq(name: str, v: object, limit: int) -> Any:
    """``v`` if it is a sequence (not str or bytes) of at most ``limit`` elements."""
    if type(v) is not tuple and (isinstance(v, (str, bytes))
                                 or not isinstance(v, (Sequence, np.ndarray))):
        raise ValueError(f"meta {name} must be a sequence, got {type(v).__name__}")
    if len(v) > limit:  # before converting anything
        raise ValueError(f"meta {name}: {len(v)} > {limit}")
    return v


def _meta_int(name: str, v: object, hi: int) -> int:
    if type(v) is not int:
        try:
            if isinstance(v, bool):
                raise TypeError
            v = operator.index(v)  # type: ignore[arg-type]
        except TypeError:
            raise ValueError(f"meta {name} must be an integer, got {v!r}") from None
    assert isinstance(v, int)
    if not 0 <= v <= hi:
        raise ValueError(f"meta {name} {v} outside [0, {hi}]")
    return v


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """What a stored object carries so an index can re-link it with no other source (a
    warm restart over a persistent tier).

    ``prev``: the prefix hash at the object's start (KV chunk, anchor page: the hash of
    ``tokens[:start]``, which is the key prefix of the chunk before it; a state: equal to
    its key's prefix). ``tokens``: the token ids of ``[start, end)`` (empty for a state,
    and allowed empty for a KV chunk or anchor page whose writer never saw token ids, e.g.
    an SGLang storage backend). ``hashes``: the prefix hash at every multiple of
    ``block_size`` in ``(start, end]``, in order, so an index keyed by an engine's own
    block hashes (which it cannot recompute from tokens) can still place states and
    anchors that end inside the chunk; ``block_size`` 0 means none are carried.

    Checked when made: ``prev`` and every hash are ``bytes`` of at most
    ``MAX_PREFIX_BYTES``; ``tokens`` at most ``MAX_META_TOKENS`` ints in ``[0,
    MAX_POSITION]`` (any sequence of integers becomes a tuple of ints); at most
    ``MAX_META_HASHES`` hashes, none without a ``block_size``; ``block_size`` an int >= 0.
    Anything else raises ValueError naming the field. ``check_key`` says whether it can
    describe a given key; ``to_bytes``/``from_bytes`` are the compact stored form (a
    256-token chunk with 16 block hashes of 16 bytes: 1,316 bytes).
    """

    prev: bytes
    tokens: tuple[int, ...] = ()
    hashes: tuple[bytes, ...] = ()
    block_size: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.prev, bytes) or len(self.prev) > MAX_PREFIX_BYTES:
            raise ValueError(f"meta prev must be bytes of at most {MAX_PREFIX_BYTES}, got "
                             f"{len(self.prev) if isinstance(self.prev, bytes) else type(self.prev).__name__}")
        object.__setattr__(self, "block_size",
                           _meta_int("block_size", self.block_size, MAX_META_BLOCK))
        toks = _meta_seq("tokens", self.tokens, MAX_META_TOKENS)
        if type(toks) is not tuple or not set(map(type, toks)) <= {int}:
            if isinstance(toks, np.ndarray):
                try:
                    toks = tuple(as_tokens(toks).tolist())
                except ValueError as exc:
                    raise ValueError(f"meta tokens: {exc}") from None
            else:
                toks = tuple(_meta_int("tokens", t, MAX_POSITION) for t in toks)
            object.__setattr__(self, "tokens", toks)
        if toks and not (min(toks) >= 0 and max(toks) <= MAX_POSITION):
            raise ValueError(f"meta tokens must lie in [0, {MAX_POSITION}]")
        hs = _meta_seq("hashes", self.hashes, MAX_META_HASHES)
        if type(hs) is not tuple:
            hs = tuple(hs)
            object.__setattr__(self, "hashes", hs)
        if hs and not (set(map(type, hs)) == {bytes} and max(map(len, hs)) <= MAX_PREFIX_BYTES):
            raise ValueError(f"meta hashes must each be bytes of at most {MAX_PREFIX_BYTES}")
        if hs and not self.block_size:
            raise ValueError("meta hashes need a block_size > 0")

    # ------------------------------------------------------------------ building
    @classmethod
    def for_range(cls, tokens: Sequence[int] | np.ndarray | None, start: int, end: int,
                  kind: ObjectKind, hasher: HasherLike) -> ObjectMeta:
        """The metadata of the object of ``kind`` covering ``[start, end)`` of a sequence
        whose prefix hashes ``hasher`` gives (``tokens``: that sequence, or None to take
        ``hasher.tokens``). A state needs ``start == end``. Uses only ``hasher.at``,
        ``hasher.block_ends`` and ``hasher.block_size``. ValueError for a range outside the
        sequence."""
        seq = getattr(hasher, "tokens", ()) if tokens is None else tokens
        if not 0 <= start <= end <= len(seq):
            raise ValueError(f"meta range [{start}, {end}) outside [0, {len(seq)}]")
        bs = hasher.block_size
        if kind is ObjectKind.STATE:
            if start != end:
                raise ValueError(f"a state sits at one position, got [{start}, {end})")
            return cls(hasher.at(end), (), (), bs)
        first = (start // bs + 1) * bs
        meta = cls(hasher.at(start), (), hasher.block_ends(first, end), bs)
        # as_tokens checked the slice (int64, non-negative): no per-token check again
        object.__setattr__(meta, "tokens", tuple(as_tokens(seq[start:end]).tolist()))
        return meta

    def check_key(self, key: ObjectKey) -> str | None:
        """Why this metadata cannot describe ``key`` (None: it can). A state carries no
        tokens or hashes and ``prev == key.prefix``; a KV chunk or anchor page carries
        ``end - start`` tokens or none, and with a ``block_size`` one hash per block end
        in ``(start, end]``."""
        if key.kind is ObjectKind.STATE:
            if self.tokens or self.hashes:
                return "a state's metadata carries no tokens or hashes"
            return None if self.prev == key.prefix else "a state's meta prev must be its key prefix"
        if self.tokens and len(self.tokens) != key.end - key.start:
            return f"{len(self.tokens)} meta tokens for the {key.end - key.start} of the key"
        bs = self.block_size
        want = key.end // bs - key.start // bs if bs else 0
        if len(self.hashes) != want:
            return f"{len(self.hashes)} meta hashes, expected {want} (block size {bs})"
        return None

    # ------------------------------------------------------------------ stored form
    def to_bytes(self) -> bytes:
        """Compact form: a 20-byte head, ``prev``, the tokens as little-endian unsigned
        ints of the smallest width of 2, 4 or 8 bytes that holds them all, then the hashes
        (all of one length: concatenated; else each after a length byte)."""
        toks = self.tokens
        top = max(toks) if toks else 0
        width = 0 if not toks else 2 if top < 1 << 16 else 4 if top < 1 << 32 else 8
        lens = {len(h) for h in self.hashes}
        hlen = lens.pop() if len(lens) == 1 else (_VAR_HASH if lens else 0)
        head = _META_HEAD.pack(_META_VERSION, len(self.prev), hlen, width, self.block_size,
                               len(toks), len(self.hashes))
        body = _struct(f"<{len(toks)}{_WIDTH_CODE[width]}").pack(*toks) if toks else b""
        if hlen == _VAR_HASH:
            hashes = b"".join(bytes([len(h)]) + h for h in self.hashes)
        else:
            hashes = b"".join(self.hashes)
        return head + self.prev + body + hashes

    @classmethod
    def from_bytes(cls, buf: bytes | bytearray | memoryview) -> ObjectMeta:
        """Inverse of ``to_bytes``; ValueError naming the field for anything malformed.
        Every length is checked against the buffer before anything is allocated from it,
        and the buffer must be consumed exactly."""
        mv = memoryview(buf).cast("B")
        if len(mv) < _META_HEAD.size:
            raise ValueError(f"meta: {len(mv)} bytes, shorter than its head")
        version, plen, hlen, width, bs, ntok, nh = _META_HEAD.unpack_from(mv)
        if version != _META_VERSION:
            raise ValueError(f"meta version {version} is not {_META_VERSION}")
        if plen > MAX_PREFIX_BYTES or (hlen > MAX_PREFIX_BYTES and hlen != _VAR_HASH):
            raise ValueError("meta prev or hash length above the limit")
        if width not in (0, 2, 4, 8) or (width == 0) != (ntok == 0):
            raise ValueError(f"meta token width {width} for {ntok} tokens")
        if ntok > MAX_META_TOKENS or nh > MAX_META_HASHES or bs > MAX_META_BLOCK:
            raise ValueError("meta tokens, hashes or block_size above the limit")
        pos = _META_HEAD.size + plen + ntok * width
        least = pos + nh * (1 if hlen == _VAR_HASH else hlen)
        if least > len(mv) or (hlen != _VAR_HASH and least != len(mv)):
            raise ValueError(f"meta: {len(mv)} bytes, its head says {least}")
        prev = bytes(mv[_META_HEAD.size : _META_HEAD.size + plen])
        toks = _struct(f"<{ntok}{_WIDTH_CODE[width]}").unpack_from(
            mv, _META_HEAD.size + plen) if ntok else ()
        if width == 8 and max(toks) > MAX_POSITION:
            raise ValueError(f"meta tokens must lie in [0, {MAX_POSITION}]")
        hashes: Sequence[bytes]
        if hlen == _VAR_HASH:
            var: list[bytes] = []
            for _ in range(nh):
                n = mv[pos] if pos < len(mv) else MAX_PREFIX_BYTES + 1
                if n > MAX_PREFIX_BYTES or pos + 1 + n > len(mv):
                    raise ValueError("meta hash length runs past the buffer or the limit")
                var.append(bytes(mv[pos + 1 : pos + 1 + n]))
                pos += 1 + n
            if pos != len(mv):
                raise ValueError(f"meta: {len(mv) - pos} bytes left over")
            hashes = var
        elif hlen and nh <= 1024:
            hashes = _struct(f"{hlen}s" * nh).unpack_from(mv, pos)
        elif hlen:
            raw = bytes(mv[pos:])
            hashes = [raw[p : p + hlen] for p in range(0, nh * hlen, hlen)]
        else:
            hashes = [b""] * nh
        if hashes and not bs:
            raise ValueError("meta hashes need a block_size > 0")
        # Every field was checked above: skip __post_init__ (it would redo it per token).
        out = object.__new__(cls)
        object.__setattr__(out, "prev", prev)
        object.__setattr__(out, "tokens", toks)
        object.__setattr__(out, "hashes", tuple(hashes))
        object.__setattr__(out, "block_size", bs)
        return out
