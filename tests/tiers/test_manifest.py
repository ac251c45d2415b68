"""The manifest formats (``hybrid_connector.tiers.manifest``), without a server: lm:// blobs round-trip,
and every damaged, truncated, oversized or foreign blob is a CorruptManifest, found
before anything the size of a claimed length is allocated."""

from __future__ import annotations

import struct
import zlib

import pytest

from hybrid_connector.tiers import lm_protocol, manifest
from hybrid_connector.tiers.manifest import CorruptManifest, Limits
from hybrid_connector.tiers.remote.clients import LmClient

LIM = Limits(max_records=8, max_record_bytes=32)


def test_round_trip_and_trim() -> None:
    recs = [b"", b"a", bytes(range(32)), b"\x00" * 32]
    assert manifest.decode("fp", manifest.encode("fp", recs), LIM) == recs
    many = [b"%d" % i for i in range(20)]
    assert manifest.trimmed(many, LIM) == many[-8:]
    assert manifest.decode("fp", manifest.encode("fp", []), LIM) == []


def test_every_truncation_and_bit_flip_is_corrupt_or_exact() -> None:
    recs = [b"one", b"", b"three33"]
    blob = manifest.encode("name", recs)
    for n in range(len(blob)):
        with pytest.raises(CorruptManifest):
            manifest.decode("name", blob[:n], LIM)
    for i in range(len(blob)):
        for bit in (0, 7):
            bad = bytearray(blob)
            bad[i] ^= 1 << bit
            with pytest.raises(CorruptManifest):
                manifest.decode("name", bytes(bad), LIM)


def _signed(name: bytes, body: bytes) -> bytes:
    raw = manifest.MAGIC + struct.pack("<H", len(name)) + name + body
    return raw + struct.pack("<I", zlib.crc32(raw))


@pytest.mark.parametrize("body, why", [
    (struct.pack("<I", 1) + struct.pack("<I", 1 << 31) + b"ab", "exceeds"),  # 2 GiB record
    (struct.pack("<I", 1) + struct.pack("<I", 33) + b"x" * 33, "exceeds"),  # over the limit
    (struct.pack("<I", 1) + struct.pack("<I", 5) + b"ab", "exceeds"),  # past the blob's end
    (struct.pack("<I", 9), "declares"),  # more records than the limit
    (struct.pack("<I", 2) + struct.pack("<I", 1) + b"a", "truncated"),
    (struct.pack("<I", 0) + b"extra", "trailing"),
])
def test_crafted_blobs_with_valid_crc_are_refused(body: bytes, why: str) -> None:
    with pytest.raises(CorruptManifest, match=why):
        manifest.decode("fp", _signed(b"fp", body), LIM)


def test_other_name_and_oversized_blob_are_refused() -> None:
    with pytest.raises(CorruptManifest, match="another name"):
        manifest.decode("fp", manifest.encode("fq", [b"r"]), LIM)
    with pytest.raises(CorruptManifest, match="bound"):
        manifest.decode("fp", bytes(LIM.max_blob_len() + 1), LIM)
    full = manifest.encode("f" * manifest.MAX_NAME, [b"x" * 32] * 8)
    assert len(full) <= LIM.max_blob_len()  # the bound admits every valid blob


def test_names_and_key_spaces() -> None:
    for bad in ["", "a b", "a@b", "x" * (manifest.MAX_NAME + 1), "é", 3]:
        with pytest.raises(ValueError, match="manifest name"):
            manifest.check_name(bad)
    assert manifest.check_name("fp:model/1.0-x") == "fp:model/1.0-x"
    with pytest.raises(ValueError, match="must be bytes"):
        manifest.check_record("text")
    with pytest.raises(ValueError, match="max_records"):
        Limits(max_records=0)
    digest = "ab" * 20  # object names are key digests: 40 hex digits
    redis_obj, redis_man = "hc:" + digest, manifest.redis_key(digest)  # RedisClient.name_for
    assert redis_man != redis_obj and ":" in redis_man[3:] and ":" not in redis_obj[3:]
    lm_obj, lm_man = lm_protocol.key_string(digest), LmClient.manifest_key(digest)
    assert lm_obj != lm_man and lm_man.startswith(lm_protocol.MANIFEST_MODEL_NAME + "@")
    assert lm_obj.split("@")[0] == lm_protocol.MODEL_NAME
