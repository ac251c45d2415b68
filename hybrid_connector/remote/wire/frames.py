"""Frames: LMCache's ``lm://`` headers (``hybrid_connector.tiers.lm_protocol``) carrying plain and hybrid
commands.

A request is a ``ClientMetaMessage`` header (``CLIENT``: command, length, fmt, dtype,
location, shape0..3, a 150-byte key) followed by ``length`` body bytes. Plain LMCache
commands (PUT=1, GET=2, EXIST=3, LIST=4, HEALTH=5) keep LMCache's exact meaning, so its
own client works unchanged: PUT gets no reply; the other replies are a ``ServerMetaMessage``
(``SERVER``) plus ``length`` body bytes. Hybrid commands use codes LMCache never sends
(``Ext``, from 101); their body and reply body are ``[u32 n][n bytes msgpack message][raw
payload bytes]`` (``pack_body``/``split_body``). A plain LMCache server that receives one
drops the connection, so a hybrid client learns at once that it reached the wrong server.

Nothing here does I/O; every parser raises ``FrameError`` (a ``ValueError``) and nothing
else on any input, which the fuzz tests check.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from hybrid_connector.tiers.lm_protocol import CLIENT, FAIL, SERVER, SUCCESS, Command

HEADER_BYTES = CLIENT.size
REPLY_BYTES = SERVER.size
_U32 = struct.Struct("<I")
MAX_MESSAGE = 64 << 20  # the msgpack part of a body (token lists, plans); payloads are raw


class Ext(IntEnum):
    """Hybrid commands (every one is answered)."""

    AUTH = 101
    HELLO = 102
    LOOKUP = 103
    DISCOVER = 104
    PLAN_SAVES = 105
    FINAL_CHECKPOINT = 106
    RECORD_LOOKUP = 107
    ACQUIRE = 108
    RELEASE = 109
    LOAD = 110
    SAVE = 111
    STATS = 112
    FLUSH = 113


class Code(IntEnum):
    """Reply codes: LMCache's two, plus the hybrid ones (only on hybrid commands, and
    ``UNAUTHORIZED`` on plain ones when a token is required)."""

    OK = SUCCESS
    FAIL = FAIL
    UNAUTHORIZED = 401
    TOO_LARGE = 413
    BAD_REQUEST = 422
    INTERNAL = 500
    UNAVAILABLE = 503


class FrameError(ValueError):
    """A frame that cannot be served; the connection is closed after it (when the frame's
    body cannot be skipped) or answered with ``BAD_REQUEST``/``TOO_LARGE``."""


PLAIN = frozenset(int(c) for c in Command)
EXT = frozenset(int(c) for c in Ext)


@dataclass(frozen=True, slots=True)
class Header:
    """A parsed request header. ``meta`` is (fmt, dtype, shape0..3): what LMCache's GET
    reply must echo for a plain object."""

    command: int
    length: int
    meta: tuple[int, int, int, int, int, int]
    key: str

    @property
    def is_ext(self) -> bool:
        return self.command in EXT


def parse_header(buf: bytes, max_length: int) -> Header:
    """The header in ``buf`` (exactly ``HEADER_BYTES``). Raises ``FrameError`` for an unknown
    command, a negative or too large body length, or a key that is not UTF-8."""
    if len(buf) != HEADER_BYTES:
        raise FrameError(f"header is {HEADER_BYTES} bytes, got {len(buf)}")
    command, length, fmt, dtype, _loc, s0, s1, s2, s3, raw = CLIENT.unpack(buf)
    if command not in PLAIN and command not in EXT:
        raise FrameError(f"unknown command {command}")
    if length < 0:
        raise FrameError(f"negative body length {length}")
    if length > max_length:
        raise FrameError(f"body of {length} B is above the limit of {max_length} B")
    if command not in (Command.PUT, *EXT) and length:
        raise FrameError(f"command {command} carries no body, got length {length}")
    try:
        key = raw.rstrip(b" \x00").decode()
    except UnicodeDecodeError:
        raise FrameError("key is not UTF-8") from None
    return Header(command, length, (fmt, dtype, s0, s1, s2, s3), key)


def request(command: int, body_len: int = 0, key: str = "",
            meta: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)) -> bytes:
    """A packed request header (``key`` at most 150 UTF-8 bytes, ValueError otherwise)."""
    raw = key.encode()
    if len(raw) > 150:
        raise ValueError(f"key longer than 150 bytes: {key!r}")
    fmt, dtype, s0, s1, s2, s3 = meta
    return CLIENT.pack(command, body_len, fmt, dtype, 0, s0, s1, s2, s3, raw.ljust(150))


def reply(code: int, body_len: int = 0,
          meta: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)) -> bytes:
    """A packed reply header (LMCache's layout: location last)."""
    fmt, dtype, s0, s1, s2, s3 = meta
    return SERVER.pack(code, body_len, fmt, dtype, s0, s1, s2, s3, 0)


def parse_reply(buf: bytes, max_length: int) -> tuple[int, int]:
    """(code, body length) of a reply header; ``FrameError`` on a malformed one."""
    if len(buf) != REPLY_BYTES:
        raise FrameError(f"reply header is {REPLY_BYTES} bytes, got {len(buf)}")
    code, length, *_ = SERVER.unpack(buf)
    if code not in {int(c) for c in Code} or not 0 <= length <= max_length:
        raise FrameError(f"bad reply header: code={code} length={length}")
    return code, length


def pack_body(message: bytes, payload_bytes: int = 0) -> bytes:
    """The prefix of a hybrid body: the message's length and the message (the caller
    sends ``payload_bytes`` of raw payloads after it); ``length`` of the frame is
    ``body_length(message, payload_bytes)``."""
    return _U32.pack(len(message)) + message


def body_length(message: bytes, payload_bytes: int = 0) -> int:
    return _U32.size + len(message) + payload_bytes


def split_body(body: bytes | memoryview) -> tuple[memoryview, memoryview]:
    """(message, payloads) of a hybrid body; ``FrameError`` when the message length does
    not fit the body or exceeds ``MAX_MESSAGE``."""
    view = memoryview(body)
    if len(view) < _U32.size:
        raise FrameError("hybrid body shorter than its length prefix")
    (n,) = _U32.unpack_from(view)
    if n > MAX_MESSAGE or _U32.size + n > len(view):
        raise FrameError(f"message length {n} does not fit a body of {len(view)} B")
    return view[_U32.size : _U32.size + n], view[_U32.size + n :]


def split_payloads(payloads: memoryview, sizes: list[int]) -> list[memoryview]:
    """``payloads`` cut into ``sizes`` (which must be positive and add up exactly)."""
    if any(s <= 0 for s in sizes) or sum(sizes) != len(payloads):
        raise FrameError(f"payload sizes {sizes[:8]} do not add up to {len(payloads)} B")
    out, pos = [], 0
    for s in sizes:
        out.append(payloads[pos : pos + s])
        pos += s
    return out
