"""Manifests: small named lists of records on the shared remote tier, so instances can find
each other's objects without knowing their exact keys (the index decides what a record
says; to the tier a record is opaque bytes).

Semantics (both stores): ``append`` adds one record at the end; a list keeps only its
newest ``Limits.max_records`` records (older ones fall off the front); reading gives at
most that many, oldest first, each at most ``Limits.max_record_bytes`` long. Duplicates
are kept (a record appended twice is listed twice). Every instance sharing a manifest
should use the same limits: a reader with smaller limits skips what it cannot accept.

Names: 1 to ``MAX_NAME`` printable ASCII characters without spaces or ``@`` (the rule of
model fingerprints, so a fingerprint is a valid name). They never collide with objects:

* Redis: one list per name under ``hc:m:<name>`` (object keys are ``hc:`` + 40 hex
  digits, which contain no ``:``). An append is ``MULTI; RPUSH; LTRIM -max -1; EXEC``, so
  concurrent appends from any number of instances lose nothing (short of the trim).
* ``lm://``: one plain object per name, keyed ``hybrid-connector-manifest@1@0@<h>@uint8``
  with ``h`` the blake3 of the name (object keys use the model name ``hybrid-connector``,
  so the two key spaces are disjoint); the blob repeats the name, so a hash collision
  reads as a corrupt manifest, never as another name's records. ``lmcache_server`` has
  only PUT/GET/EXIST, so an append is a read-modify-write: two instances appending to one
  name at once may lose one of the two records (a missed hit for the index, never
  corruption: a PUT replaces the whole object atomically).

lm:// blob layout (little endian)::

    magic b"HCM1" | u16 name length | name | u32 count | count x (u32 length | bytes)
    | u32 crc32 of everything before it

``decode`` checks every length against the limits and what is left of the blob before
slicing, so a hostile blob can make it allocate nothing beyond the blob itself.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import blake3

MAX_NAME = 256
_NAME_RE = re.compile(r"[!-?A-~]+")  # printable ASCII, no space, no '@'
REDIS_PREFIX = "hc:m:"
MAGIC = b"HCM1"
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")


class CorruptManifest(ValueError):
    """A stored manifest that fails a structural or checksum check (or exceeds the limits)."""


# What an index announces a chunk with (its key, size and metadata: ~1.4 KiB for 256
# tokens) fits well within this; the tiers built from a config use it.
RECORD_BYTES = 16384


@dataclass(frozen=True)
class Limits:
    """Bounds of one manifest: the newest ``max_records`` records are kept, each at most
    ``max_record_bytes`` long (longer ones are refused at append and skipped at read)."""

    max_records: int = 1024
    max_record_bytes: int = RECORD_BYTES

    def __post_init__(self) -> None:
        for f in ("max_records", "max_record_bytes"):
            v = getattr(self, f)
            if type(v) is not int or not 1 <= v <= 1 << 24:
                raise ValueError(f"manifest {f} must be an integer in [1, 2**24], got {v!r}")

    def max_blob_len(self) -> int:
        """The longest lm:// manifest blob these limits allow (a longer reply is refused)."""
        return (len(MAGIC) + _U16.size + MAX_NAME + 2 * _U32.size
                + self.max_records * (_U32.size + self.max_record_bytes))


def check_name(name: object) -> str:
    """``name`` if it is a valid manifest name, else ValueError naming the rule."""
    if type(name) is not str or not 0 < len(name) <= MAX_NAME or not _NAME_RE.fullmatch(name):
        shown = name[:40] if isinstance(name, str) else type(name).__name__
        raise ValueError(f"manifest name {shown!r}: expected 1 to {MAX_NAME} printable ASCII "
                         "characters without spaces or '@'")
    return name


def check_record(record: object) -> bytes:
    """``record`` as bytes (bytes, bytearray or memoryview), else ValueError."""
    if isinstance(record, bytes | bytearray | memoryview):
        return bytes(record)
    raise ValueError(f"a manifest record must be bytes, got {type(record).__name__}")


def redis_key(name: str) -> str:
    """The Redis list holding manifest ``name``."""
    return REDIS_PREFIX + name


def name_digest(name: str) -> str:
    """40 hex digits naming manifest ``name`` where only a hash fits (lm:// keys)."""
    return blake3.blake3(name.encode()).hexdigest(length=20)


def trimmed(records: Sequence[bytes], limits: Limits) -> list[bytes]:
    """The newest ``limits.max_records`` of ``records`` (oldest first)."""
    return list(records[-limits.max_records:])


def encode(name: str, records: Sequence[bytes]) -> bytes:
    """The lm:// blob of manifest ``name`` holding ``records`` (in order)."""
    nb = name.encode()
    parts = [MAGIC, _U16.pack(len(nb)), nb, _U32.pack(len(records))]
    for r in records:
        parts += [_U32.pack(len(r)), r]
    body = b"".join(parts)
    return body + _U32.pack(zlib.crc32(body))


def decode(name: str, blob: bytes | bytearray | memoryview, limits: Limits) -> list[bytes]:
    """Records of an ``encode`` blob of manifest ``name``; CorruptManifest if it is
    malformed, fails its CRC, belongs to another name or exceeds ``limits``."""
    mv = memoryview(blob).cast("B")
    if len(mv) > limits.max_blob_len():
        raise CorruptManifest(f"manifest of {len(mv)} bytes exceeds the bound")
    if len(mv) < len(MAGIC) + _U16.size + 2 * _U32.size or bytes(mv[:4]) != MAGIC:
        raise CorruptManifest("bad manifest magic or length")
    if zlib.crc32(mv[:-4]) != _U32.unpack_from(mv, len(mv) - 4)[0]:
        raise CorruptManifest("manifest checksum mismatch")
    end = len(mv) - 4
    pos = len(MAGIC)
    (nlen,) = _U16.unpack_from(mv, pos)
    pos += _U16.size
    if nlen > MAX_NAME or pos + nlen + _U32.size > end or bytes(mv[pos:pos + nlen]) != name.encode():
        raise CorruptManifest("manifest belongs to another name")
    pos += nlen
    (count,) = _U32.unpack_from(mv, pos)
    pos += _U32.size
    if count > limits.max_records:
        raise CorruptManifest(f"manifest declares {count} records, limit {limits.max_records}")
    out = []
    for _ in range(count):
        if pos + _U32.size > end:
            raise CorruptManifest("truncated manifest")
        (n,) = _U32.unpack_from(mv, pos)
        pos += _U32.size
        if n > limits.max_record_bytes or pos + n > end:  # checked before the slice
            raise CorruptManifest(f"manifest record of {n} bytes exceeds the bound or the blob")
        out.append(bytes(mv[pos:pos + n]))
        pos += n
    if pos != end:
        raise CorruptManifest("trailing bytes after the manifest records")
    return out
