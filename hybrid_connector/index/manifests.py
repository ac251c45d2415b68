"""How instances sharing a remote tier find each other's objects: manifest names and
records (the shared tier stores them, see ``hybrid_connector.tiers.manifest``).

Every KV chunk written to the shared tier is announced in the manifest named by its model
fingerprint and the prefix hash at its start: ``<fingerprint>.<hash hex>``. The record
holds the chunk's key, size and ``ObjectMeta`` (its tokens and chain hashes). Another
instance that holds a prompt's KV up to position p (nothing, at first) reads the manifest
of the hash at p, picks the chunk whose tokens continue its prompt, and walks on from that
chunk's end. Checkpoints and anchor pages are found by their keys instead (the instance can
compute the key of a state at any position of its own prompt and ask the tier).
"""

from __future__ import annotations

import struct

from hybrid_connector.core.keys import ObjectKey
from hybrid_connector.core.meta import ObjectMeta

_HEAD = struct.Struct("<HQ")  # key string length, payload bytes


def manifest_name(fingerprint: str, prev: bytes) -> str:
    """The manifest announcing the chunks that start at the prefix hashed ``prev``."""
    return f"{fingerprint}.{prev.hex()}"


def encode_record(key: ObjectKey, nbytes: int, meta: ObjectMeta) -> bytes:
    """The record announcing ``key`` (``nbytes`` per rank, ``meta`` its metadata)."""
    ks = key.to_str().encode()
    return _HEAD.pack(len(ks), nbytes) + ks + meta.to_bytes()


def decode_record(data: bytes) -> tuple[ObjectKey, int, ObjectMeta] | None:
    """The announced ``(key, nbytes, meta)``, or None for a record that does not decode or
    whose metadata cannot describe its key (another instance's bug, or a hostile peer)."""
    try:
        if len(data) < _HEAD.size:  # the tier bounded its length (hybrid_connector.tiers.manifest.Limits)
            return None
        klen, nbytes = _HEAD.unpack_from(data)
        if _HEAD.size + klen > len(data) or nbytes <= 0:
            return None
        key = ObjectKey.from_str(bytes(data[_HEAD.size : _HEAD.size + klen]).decode())
        meta = ObjectMeta.from_bytes(bytes(data[_HEAD.size + klen :]))
    except (ValueError, UnicodeDecodeError, struct.error):
        return None
    return None if meta.check_key(key) is not None else (key, nbytes, meta)
