"""Wire format of LMCache's legacy ``lmcache_server`` (``lm://host:port``), lmcache 0.5.6.

Checked against ``lmcache/v1/protocol.py`` and ``lmcache/v1/server/__main__.py`` of the
installed 0.5.6 release (native byte order and alignment, as ``struct`` defaults):

* request  ``ClientMetaMessage``: ``"iiiiiiiii150s"`` = command, length, fmt, dtype,
  location, shape0..3, key (utf-8, space padded to 150 bytes); for PUT, ``length`` body
  bytes follow and the server sends **no reply**.
* reply    ``ServerMetaMessage``: ``"iiiiiiiii"`` = code, length, fmt, dtype, shape0..3,
  location (note: location comes *last* here, *before* the shape in the request); for a
  successful GET, ``length`` body bytes follow.

Commands: PUT=1, GET=2, EXIST=3, LIST=4 (not implemented by the server), HEALTH=5. Codes:
200 success, 400 fail (a GET/EXIST miss). The server parses the key as a
``CacheEngineKey`` (``model@world_size@worker_id@hexhash@dtype``); a key it cannot parse
makes it drop the connection. This module does no I/O.
"""

from __future__ import annotations

import struct
from enum import IntEnum

MAX_KEY_LENGTH = 150
CLIENT = struct.Struct(f"iiiiiiiii{MAX_KEY_LENGTH}s")
SERVER = struct.Struct("iiiiiiiii")
FMT_BINARY = 4  # MemoryFormat.BINARY: the shape is [length, 0, 0, 0] and kept verbatim
DTYPE_UINT8 = 6  # protocol.DTYPE_TO_INT[torch.uint8]
MODEL_NAME = "hybrid-connector"
MANIFEST_MODEL_NAME = "hybrid-connector-manifest"  # manifests (hybrid_connector.tiers.manifest): own key space
# The object kind rides in the key's model field (``hybrid-connector-state``): a plain server
# keys by the whole string and ignores it; our cache server puts each kind in its own pool.
KIND_MODEL_PREFIX = MODEL_NAME + "-"


def kind_model(kind: str) -> str:
    """The model field of an object of ``kind`` (an ``ObjectKind`` value)."""
    return KIND_MODEL_PREFIX + kind


def kind_of_model(model: str) -> str | None:
    """The object kind a key's model field carries (None: a plain LMCache key)."""
    if model.startswith(KIND_MODEL_PREFIX):
        kind = model[len(KIND_MODEL_PREFIX):]
        return kind if kind in ("kv", "state", "anchor") else None
    return None


class Command(IntEnum):
    PUT = 1
    GET = 2
    EXIST = 3
    LIST = 4
    HEALTH = 5


SUCCESS = 200
FAIL = 400


def key_string(digest_hex: str, model: str = MODEL_NAME) -> str:
    """A ``CacheEngineKey`` string the server accepts, unique per object digest and model
    name (``MODEL_NAME`` for objects, ``MANIFEST_MODEL_NAME`` for manifests: the server
    keys by the whole parsed key, so the two never collide)."""
    # The server parses the hash as hex into an int and prints it back without leading
    # zeros (CacheEngineKey.chunk_hash_hex); use that canonical form.
    s = f"{model}@1@0@{int(digest_hex, 16):x}@uint8"
    if len(s) > MAX_KEY_LENGTH:
        raise ValueError(f"key string longer than {MAX_KEY_LENGTH}: {s!r}")
    return s


def request(command: Command, key: str, length: int = 0) -> bytes:
    """A packed request header; PUT bodies are opaque bytes (BINARY, uint8, [length])."""
    shape0 = length if command is Command.PUT else 0
    return CLIENT.pack(int(command), length, FMT_BINARY, DTYPE_UINT8, 0, shape0, 0, 0, 0,
                       key.encode().ljust(MAX_KEY_LENGTH))


def parse_reply(buf: bytes) -> tuple[int, int]:
    """(code, body length) of a reply header; ValueError on a malformed one."""
    code, length, _fmt, _dtype, _s0, _s1, _s2, _s3, _loc = SERVER.unpack(buf)
    if code not in (SUCCESS, FAIL) or length < 0:
        raise ValueError(f"bad reply header: code={code} length={length}")
    return code, length
