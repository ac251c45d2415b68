"""Self-describing, checksummed serialisation of one keyed tensor (NVMe files, remote blobs).

Layout::

    prefix  "<4sBBHII": magic b"HCT1", version, flags, reserved, header length, crc32(header)
    header  JSON: key (ObjectKey.to_str), kind, shape, dtype, nbytes (raw), stored (bytes
            that follow), codec ("raw" | "zstd"), checksum of the raw bytes ("xxh3:<hex>",
            xxh3-128, or "blake3:<hex>" where xxhash is missing)
            optional: meta_len, meta_crc (crc32 of the metadata), both or neither
    meta    ``meta_len`` bytes (only with those fields): ``ObjectMeta.to_bytes``
    body    ``stored`` bytes: the raw tensor bytes, or their zstd frame

The checksum covers the raw bytes, so a bad decompression is caught as well as a torn or
flipped body; the header CRC catches a damaged header before it is trusted, and the
metadata CRC, inside the header, damaged metadata. Files and blobs without metadata (the
format before it existed) still decode. dtype and shape round-trip exactly (any torch
dtype, including bfloat16 and 0-d/empty shapes).
"""

from __future__ import annotations

import functools
import json
import math
import re
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import blake3
import numpy as np
import torch

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.core.meta import MAX_META_BYTES, ObjectMeta
from hybrid_connector.tiers.tier import byte_view

MAGIC = b"HCT1"
VERSION = 1
PREFIX = struct.Struct("<4sBBHII")
MAX_HEADER = 1 << 16
MAX_DIMS = 64
# The most a zstd frame can inflate: a 4-byte RLE block yields one 128 KiB block, and the
# frame header only adds bytes, so nbytes <= stored * 32768 for any valid frame.
ZSTD_MAX_RATIO = 1 << 15
ZSTD_FRAME_HEADER_MAX = 18  # magic, descriptor, window, dictionary id, content size
_DTYPE_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_CHECKSUM_RE = re.compile(r"(xxh3|blake3):[0-9a-f]{32}")
_QUANTIZED = frozenset({torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4})
_KINDS = frozenset(k.value for k in ObjectKind)
_FIELDS: dict[str, type] = {"key": str, "kind": str, "shape": list, "dtype": str,
                            "nbytes": int, "stored": int, "codec": str, "checksum": str}
_META_FIELDS: dict[str, type] = {"meta_len": int, "meta_crc": int}
_ALL_FIELDS = {**_FIELDS, **_META_FIELDS}
_BLAKE_THREADS_MIN = 1 << 20  # multi-threaded hashing pays off above ~1 MiB


class CorruptObject(ValueError):
    """Stored bytes that fail a structural or checksum check."""


def raw_bytes(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a flat uint8 numpy view (a copy only when not on CPU)."""
    flat = t.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    return flat.view(torch.uint8).numpy()


Buf = bytes | bytearray | memoryview

try:  # xxh3-128 runs at memory speed (~20 GB/s); blake3 is the fallback (~4 GB/s)
    import xxhash

    _HAVE_XXH = True
except ImportError:  # pragma: no cover - xxhash is a declared dependency
    _HAVE_XXH = False


def _xxh3(buf: Buf) -> str:
    return "xxh3:" + xxhash.xxh3_128(buf).hexdigest()


def _blake3(buf: Buf) -> str:
    threads = blake3.blake3.AUTO if len(buf) >= _BLAKE_THREADS_MIN else 1
    return "blake3:" + blake3.blake3(buf, max_threads=threads).hexdigest(length=16)


def checksum(buf: Buf, like: str | None = None) -> str:
    """Tagged payload checksum (``xxh3:<hex>`` or ``blake3:<hex>``). With ``like`` (a stored
    checksum) the same algorithm is used, so files written either way stay verifiable."""
    if like is not None and like.startswith("blake3:"):
        return _blake3(buf)
    if _HAVE_XXH:
        return _xxh3(buf)
    if like is not None and like.startswith("xxh3:"):
        raise CorruptObject("object checksummed with xxh3 but xxhash is not installed")
    return _blake3(buf)


@functools.cache
def _dtype_from_valid_name(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype) or dt in _QUANTIZED:  # no payload has those
        raise CorruptObject(f"unknown dtype {name!r}")
    return dt


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (``"float32"`` or ``"torch.float32"``);
    CorruptObject for anything else."""
    name = name.removeprefix("torch.")
    if not _DTYPE_NAME_RE.fullmatch(name):  # also keeps hostile names out of the cache
        raise CorruptObject(f"unknown dtype {name[:40]!r}")
    return _dtype_from_valid_name(name)


def itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def new_checksum(like: str | None = None) -> Hasher:
    """An incremental hasher (``update(buf)``, ``tag()``) for the algorithm of ``like``."""
    return Hasher(like)


class Hasher:
    """Streaming form of ``checksum`` so a read can hash each chunk while it is in cache."""

    def __init__(self, like: str | None) -> None:
        self.blake = (like is not None and like.startswith("blake3:")) or not _HAVE_XXH
        self._h: Any = blake3.blake3() if self.blake else xxhash.xxh3_128()

    def update(self, buf: Buf) -> None:
        self._h.update(buf)

    def tag(self) -> str:
        if self.blake:
            return "blake3:" + self._h.hexdigest(length=16)
        return "xxh3:" + self._h.hexdigest()


@dataclass(frozen=True, slots=True)
class Header:
    key: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    stored: int
    codec: str
    checksum: str
    meta_len: int = 0  # metadata bytes between the header and the body (0: none)
    meta_crc: int = 0

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_from_name(self.dtype)


def encode_header(key: ObjectKey, t: torch.Tensor, body_len: int, codec: str, digest: str,
                  meta: ObjectMeta | None = None) -> bytes:
    """Prefix + header (+ the metadata, when given) bytes for ``t`` whose body
    (``body_len`` bytes) follows."""
    fields: dict[str, object] = {
        "key": key.to_str(), "kind": key.kind.value, "shape": list(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."), "nbytes": t.numel() * t.element_size(),
        "stored": body_len, "codec": codec, "checksum": digest,
    }
    mbytes = b"" if meta is None else meta.to_bytes()
    if mbytes:
        fields["meta_len"], fields["meta_crc"] = len(mbytes), zlib.crc32(mbytes)
    hdr = json.dumps(fields, separators=(",", ":")).encode()
    return PREFIX.pack(MAGIC, VERSION, 0, 0, len(hdr), zlib.crc32(hdr)) + hdr + mbytes


def decode_prefix(buf: bytes) -> tuple[int, int]:
    """(header length, header crc) from the fixed prefix; CorruptObject if malformed."""
    if len(buf) < PREFIX.size:
        raise CorruptObject("truncated prefix")
    magic, version, _flags, _res, hlen, hcrc = PREFIX.unpack_from(buf)
    if magic != MAGIC or version != VERSION or not 0 < hlen <= MAX_HEADER:
        raise CorruptObject("bad magic, version or header length")
    return hlen, hcrc


def _no_float(token: str) -> None:
    raise CorruptObject(f"non-integer number {token[:40]!r} in header")


def decode_header(hbytes: bytes, hcrc: int) -> Header:
    """Parse and strictly validate a header (after its CRC): exactly the known fields with
    their JSON types (integers only, no floats, NaN or Infinity, bools are not integers),
    a known kind, dtype and codec, at most ``MAX_DIMS`` dims each >= 0, ``nbytes`` equal to
    shape x itemsize, and a body size consistent with it (raw: equal; zstd: at most
    ``ZSTD_MAX_RATIO`` times smaller). Raises CorruptObject, never anything else, so
    callers can bound every allocation by the header and the header by the file. The
    optional ``meta_len`` (1 to ``MAX_META_BYTES``) and ``meta_crc`` (a crc32) come
    together; ``decode_meta`` checks the metadata they describe."""
    if zlib.crc32(hbytes) != hcrc:
        raise CorruptObject("header checksum mismatch")
    try:
        d = json.loads(hbytes, parse_float=_no_float, parse_constant=_no_float)
    except RecursionError:  # deep nesting ("[[[[..."): the parser's recursion limit
        raise CorruptObject("header nests too deeply") from None
    except ValueError as exc:  # bad JSON or UTF-8, an integer of thousands of digits
        raise CorruptObject(f"bad header: {str(exc)[:200]}") from None
    if type(d) is not dict or d.keys() not in (_FIELDS.keys(), _ALL_FIELDS.keys()):
        raise CorruptObject("header fields are missing or unknown")
    for name, typ in _ALL_FIELDS.items():
        if name in d and type(d[name]) is not typ:
            raise CorruptObject(f"header field {name!r} is not a {typ.__name__}")
    mlen, mcrc = d.get("meta_len", 0), d.get("meta_crc", 0)
    if "meta_len" in d and not (0 < mlen <= MAX_META_BYTES and 0 <= mcrc < 1 << 32):
        raise CorruptObject("header meta_len or meta_crc out of range")
    shape = d["shape"]
    if len(shape) > MAX_DIMS or not all(type(x) is int and x >= 0 for x in shape):
        raise CorruptObject("header shape must be at most 64 integers >= 0")
    h = Header(d["key"], d["kind"], tuple(shape), d["dtype"], d["nbytes"], d["stored"],
               d["codec"], d["checksum"], mlen, mcrc)
    if h.kind not in _KINDS or h.codec not in ("raw", "zstd"):
        raise CorruptObject("header kind or codec is unknown")
    if not _CHECKSUM_RE.fullmatch(h.checksum):
        raise CorruptObject("header checksum field is malformed")
    if math.prod(h.shape) * itemsize(h.torch_dtype) != h.nbytes or h.stored < 0:
        raise CorruptObject("header fields are inconsistent")
    if h.codec == "raw" and h.stored != h.nbytes:
        raise CorruptObject("raw body length differs from nbytes")
    if h.codec == "zstd" and h.nbytes > h.stored * ZSTD_MAX_RATIO:
        raise CorruptObject("zstd body too small for nbytes")
    return h


def decode_meta(h: Header, mbytes: Buf, key: ObjectKey) -> ObjectMeta | None:
    """The ``ObjectMeta`` of the ``h.meta_len`` bytes that follow ``h`` (None when ``h``
    has none): CorruptObject if they are short, fail the header's CRC, are malformed, or
    cannot describe ``key``."""
    if not h.meta_len:
        return None
    if len(mbytes) != h.meta_len or zlib.crc32(mbytes) != h.meta_crc:
        raise CorruptObject("metadata truncated or checksum mismatch")
    try:
        meta = ObjectMeta.from_bytes(mbytes)
    except ValueError as exc:
        raise CorruptObject(f"bad metadata: {exc}") from None
    why = meta.check_key(key)
    if why is not None:
        raise CorruptObject(f"metadata does not fit its key: {why}")
    return meta


def check_frame(h: Header, body_head: Buf) -> None:
    """For a zstd body, check that its frame header (the first ``ZSTD_FRAME_HEADER_MAX``
    bytes of the body suffice) declares exactly ``h.nbytes``: the decompressor allocates
    what the frame declares, so this must hold before decompressing (``encode`` always
    writes the content size). CorruptObject otherwise; no-op for raw."""
    if h.codec != "zstd":
        return
    import zstandard

    try:
        size = zstandard.frame_content_size(bytes(memoryview(body_head)[:ZSTD_FRAME_HEADER_MAX]))
    except zstandard.ZstdError as exc:
        raise CorruptObject(f"zstd frame header: {exc}") from None
    if size != h.nbytes:
        raise CorruptObject(f"zstd frame declares {size} bytes, header {h.nbytes}")


def max_blob_len(nbytes: int, meta_len: int = 0) -> int:
    """An upper bound on the size of any blob ``encode_blob`` makes of ``nbytes`` payload
    bytes and ``meta_len`` metadata bytes (prefix, the largest header, and zstd's
    worst-case expansion), so a reader can refuse a longer one before allocating it."""
    zstd_bound = nbytes + (nbytes >> 8) + (((128 << 10) - nbytes) >> 11 if nbytes < 128 << 10 else 0)
    return PREFIX.size + MAX_HEADER + meta_len + zstd_bound + 64  # + frame header, checksum


def encode(key: ObjectKey, t: torch.Tensor, zstd_level: int | None = None,
           meta: ObjectMeta | None = None) -> tuple[bytes, Buf]:
    """(prefix+header+metadata, body) of ``t``; the body is a view of the tensor when
    uncompressed."""
    raw = raw_bytes(t).data
    digest = checksum(raw)
    body: Buf = raw
    codec = "raw"
    if zstd_level is not None:
        import zstandard

        body = zstandard.ZstdCompressor(level=zstd_level).compress(raw)
        codec = "zstd"
    return encode_header(key, t, len(body), codec, digest, meta), body


def decode_into(h: Header, body: Buf, out: torch.Tensor) -> None:
    """Decode ``body`` into ``out`` (matching dtype and shape) and verify the checksum.

    ``out`` may be on any device; raises CorruptObject on any mismatch (``out`` content
    is then undefined).
    """
    if tuple(out.shape) != h.shape or out.dtype != h.torch_dtype:
        raise CorruptObject("buffer does not match the stored dtype/shape")
    if len(body) != h.stored:
        raise CorruptObject("truncated body")
    if h.codec == "zstd":
        import zstandard

        check_frame(h, body)
        try:
            raw: Buf = zstandard.ZstdDecompressor().decompress(
                bytes(body), max_output_size=h.nbytes)
        except zstandard.ZstdError as exc:
            raise CorruptObject(f"zstd: {exc}") from exc
        if len(raw) != h.nbytes:
            raise CorruptObject("decompressed length mismatch")
    else:
        raw = body
    if checksum(raw, like=h.checksum) != h.checksum:
        raise CorruptObject("payload checksum mismatch")
    if h.nbytes == 0:
        return
    if out.device.type == "cpu":
        byte_view(out)[:] = memoryview(raw).cast("B")
    else:
        src = np.frombuffer(raw, dtype=np.uint8).copy()
        out.reshape(-1).view(torch.uint8).copy_(torch.from_numpy(src))


def encode_blob(key: ObjectKey, t: torch.Tensor, zstd_level: int | None = None,
                meta: ObjectMeta | None = None) -> bytes:
    """One contiguous blob (remote stores)."""
    head, body = encode(key, t, zstd_level, meta)
    return head + bytes(body)


def decode_blob_into(key: ObjectKey, blob: Buf, out: torch.Tensor) -> None:
    """Decode an ``encode_blob`` blob straight into ``out`` (matching dtype and shape);
    CorruptObject if it is damaged, belongs to another key or does not match ``out``."""
    mv = memoryview(blob)
    hlen, hcrc = decode_prefix(bytes(mv[: PREFIX.size]))
    h = decode_header(bytes(mv[PREFIX.size : PREFIX.size + hlen]), hcrc)
    if h.key != key.to_str():
        raise CorruptObject("blob belongs to another key")
    decode_into(h, mv[PREFIX.size + hlen + h.meta_len :], out)


def blob_meta(blob: Buf) -> Header:
    """The header of a blob (CorruptObject if malformed)."""
    mv = memoryview(blob)
    hlen, hcrc = decode_prefix(bytes(mv[: PREFIX.size]))
    return decode_header(bytes(mv[PREFIX.size : PREFIX.size + hlen]), hcrc)


def decode_blob(key: ObjectKey, blob: Buf) -> torch.Tensor:
    """Tensor from ``encode_blob`` output; CorruptObject if damaged or for another key."""
    h = blob_meta(blob)
    out = torch.empty(h.shape, dtype=h.torch_dtype)
    decode_blob_into(key, blob, out)
    return out
