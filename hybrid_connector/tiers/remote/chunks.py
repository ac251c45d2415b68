"""Chunked values of the cluster client (``hybrid_connector.tiers.remote.cluster``).

A blob longer than the chunk size is stored as chunks of at most that size, then a small
pointer under the object's own name: ``POINTER`` = magic ``HCC1``, an 8-byte version id
(random per put), the number of chunks, the blob's length, the chunk size and a CRC32 of
those fields. Chunk ``i`` lives under ``<name>:<version hex>:<i>``; the name carries the
object's hash tag (``hc:{digest}``), so its chunks share its slot and its shard.

Why: one command moving 50 MB (a large state) keeps a Redis shard busy copying it while
every other client of that shard waits; chunk commands let the shard serve others between
them. Why a version id: a reader that follows a pointer reads only chunks written for it,
so it can never splice two puts of the same key; a writer that replaces a pointer unlinks
the old version's chunks, and a reader still on them finds one missing, which is a miss.
A pointer that fails its CRC, or whose chunk size is below ``MIN_CHUNK`` (no writer uses
one), is no pointer: it is handed on as the blob, which the codec then refuses like any
damaged blob. Nothing here is trusted further: the codec's header and payload checksums
verify the reassembled blob.

A pointer is written by anyone who can reach the store, so its claims cost nothing until
checked: chunk names are generated lazily (``ChunkNames``), never as a list of the claimed
count, and callers bound the claimed length by the largest blob they accept before
following it (``hybrid_connector.tiers.remote.cluster``): with ``MIN_CHUNK``, a bound of ``max_len`` bytes
bounds the chunks at ``max_len / MIN_CHUNK``.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

MAGIC = b"HCC1"
POINTER = struct.Struct("<4s8sIQII")  # magic, version, chunks, total, chunk size, crc32
MAX_CHUNK = 512 << 20  # Redis's proto-max-bulk-len default
MIN_CHUNK = 64 << 10  # the least ``remote_chunk_size`` the config accepts


class ChunkNames(Sequence[str]):
    """The names of a pointer's chunks, made on demand (a hostile pointer may claim 2**32
    of them; a list would be hundreds of GB before the first command)."""

    def __init__(self, name: str, version: bytes, count: int) -> None:
        self._prefix, self._count = f"{name}:{version.hex()}:", count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self._prefix + str(j) for j in range(*i.indices(self._count))]
        if not -self._count <= i < self._count:
            raise IndexError(i)
        return self._prefix + str(i % self._count)

    def __iter__(self) -> Iterator[str]:
        return (self._prefix + str(j) for j in range(self._count))


@dataclass(frozen=True)
class Pointer:
    version: bytes
    chunks: int
    total: int
    chunk_size: int

    def encode(self) -> bytes:
        head = POINTER.pack(MAGIC, self.version, self.chunks, self.total, self.chunk_size, 0)
        return head[:-4] + struct.pack("<I", zlib.crc32(head[:-4]))

    def chunk_names(self, name: str) -> ChunkNames:
        """The chunks' names (lazy: nothing is built for the count the pointer claims)."""
        return ChunkNames(name, self.version, self.chunks)


def decode_pointer(value: bytes, min_chunk: int = MIN_CHUNK) -> Pointer | None:
    """The pointer ``value`` holds; None when it is not a valid pointer (a plain blob).
    ``min_chunk``: the least chunk size a valid pointer has. Its total is the caller's to
    bound (see the module docstring)."""
    if len(value) != POINTER.size or not value.startswith(MAGIC):
        return None
    _, version, chunks, total, size, crc = POINTER.unpack(value)
    if crc != zlib.crc32(value[:-4]) or not min_chunk <= size <= MAX_CHUNK:
        return None
    if chunks != -(-total // size) or total == 0:
        return None
    return Pointer(version, chunks, total, size)


def split(blob: bytes | bytearray | memoryview, chunk_size: int) -> tuple[Pointer, list[memoryview]]:
    """A new version's pointer of ``blob`` and its chunks (views, nothing copied)."""
    mv = memoryview(blob)
    n = -(-len(mv) // chunk_size)
    ptr = Pointer(os.urandom(8), n, len(mv), chunk_size)
    return ptr, [mv[i * chunk_size:(i + 1) * chunk_size] for i in range(n)]
