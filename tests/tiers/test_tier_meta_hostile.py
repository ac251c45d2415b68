"""NVMe object metadata against a hostile directory and against SIGKILL.

Crafted files whose header and metadata CRCs are valid but whose metadata lies (lengths
past the file, absurd token counts, deep nesting, metadata that cannot describe the key)
are dropped at start like any other crafted header, while their neighbours load. A writer
killed mid-put never leaves an object whose metadata belongs to another version."""

from __future__ import annotations

import json
import os
import random
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from crash_support import fork_and_kill
from hostile_peers import crafted_blob
from tier_helpers import make_key, make_payload, same_bits

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.core.meta import MAX_META_BYTES, ObjectMeta
from hybrid_connector.tiers import codec
from hybrid_connector.tiers.dirlock import LOCK_NAME
from hybrid_connector.tiers.nvme import NvmeTier

K = ObjectKind
HUGE = {k: 1 << 42 for k in K}  # so that only validation, not the budget, can refuse


def _meta_head(plen: int = 16, hlen: int = 16, width: int = 4, bs: int = 16, ntok: int = 16,
               nh: int = 1) -> bytes:
    return struct.pack("<BBBBQII", 1, plen, hlen, width, bs, ntok, nh)


def _file(k: ObjectKey, mbytes: bytes, **over: object) -> bytes:
    """A file whose header is CRC-valid and whose metadata CRC matches ``mbytes`` unless
    ``over`` says otherwise."""
    body = bytes(256)
    h: dict[str, object] = {"key": k.to_str(), "kind": k.kind.value, "shape": [64],
                            "dtype": "float32", "nbytes": 256, "stored": 256, "codec": "raw",
                            "checksum": codec.checksum(body), "meta_len": len(mbytes),
                            "meta_crc": zlib.crc32(mbytes)}
    h.update(over)
    h = {n: v for n, v in h.items() if v is not None}
    return crafted_blob(json.dumps(h).encode(), mbytes + body)


def _crafted(k: ObjectKey, damage: str) -> bytes:
    good = ObjectMeta(b"p" * 16, tuple(range(16)), (b"h" * 16,), 16).to_bytes()
    if damage == "meta_len_past_the_file":
        return _file(k, good, meta_len=1 << 23)
    if damage == "meta_len_above_the_limit":
        return _file(k, good, meta_len=MAX_META_BYTES + 1)
    if damage == "meta_len_zero":
        return _file(k, b"")
    if damage == "meta_len_float":
        return _file(k, good, meta_len=float(len(good)))
    if damage == "meta_len_bool":
        return _file(k, good, meta_len=True)
    if damage == "meta_crc_negative":
        return _file(k, good, meta_crc=-1)
    if damage == "meta_len_without_crc":
        return _file(k, good, meta_crc=None)
    if damage == "meta_crc_mismatch":
        return _file(k, good, meta_crc=zlib.crc32(good) ^ 1)
    if damage == "meta_nested_60k":
        head = (b'{"key":"%s","kind":"kv","shape":[64],"dtype":"float32","nbytes":256,'
                b'"stored":256,"codec":"raw","checksum":"%s","meta_len":' % (
                    k.to_str().encode(), codec.checksum(bytes(256)).encode()))
        return crafted_blob(head + b"[" * 60000, bytes(256))
    if damage == "tokens_claim_4G":  # CRC-valid metadata claiming 2**32 - 1 tokens
        return _file(k, _meta_head(ntok=0xFFFFFFFF) + bytes(64))
    if damage == "tokens_over_limit":
        n = (1 << 20) + 1
        return _file(k, _meta_head(ntok=n, nh=0, width=2) + bytes(16 + 2 * n))
    if damage == "hashes_claim_4G":
        return _file(k, _meta_head(nh=0xFFFFFFFF) + bytes(16 + 64))
    if damage == "meta_bad_version":
        return _file(k, b"\x02" + good[1:])
    if damage == "meta_of_another_range":  # 20 tokens for a 16-token key
        return _file(k, ObjectMeta(b"p", tuple(range(20)), (b"h",), 16).to_bytes())
    if damage == "kv_meta_missing_its_block_hashes":
        return _file(k, ObjectMeta(k.prefix, (), (), 16).to_bytes())
    raise AssertionError(damage)


DAMAGES = ["meta_len_past_the_file", "meta_len_above_the_limit", "meta_len_zero",
           "meta_len_float", "meta_len_bool", "meta_crc_negative", "meta_len_without_crc",
           "meta_crc_mismatch", "meta_nested_60k", "tokens_claim_4G", "tokens_over_limit",
           "hashes_claim_4G", "meta_bad_version", "meta_of_another_range",
           "kv_meta_missing_its_block_hashes"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_crafted_metadata_is_dropped_at_start(tmp_path: Path, damage: str) -> None:
    d = tmp_path / "nvme"
    tier = NvmeTier(d, HUGE)
    good, gv = make_key(1), make_payload(1)
    gm = ObjectMeta(b"", tuple(range(16)), (b"x" * 16,), 16)
    assert tier.put([(good, gv)], [gm]) == [True]
    bad = make_key(2)
    (d / bad.digest()).write_bytes(_crafted(bad, damage))
    tier.close()  # a restart: one live store per directory
    t2 = NvmeTier(d, HUGE)  # starts: one bad file never stops a restart
    assert t2.inventory() == [(good, 128, gm)]
    assert bad.digest() in t2.dropped_at_start
    assert t2.get([bad]) == [None]
    assert sorted(p.name for p in d.iterdir() if p.name != LOCK_NAME) == [good.digest()]


def test_the_crafted_file_builder_makes_loadable_files(tmp_path: Path) -> None:
    """Control: ``_file`` with honest metadata is accepted, so each damage above is what
    gets a file dropped."""
    d = tmp_path / "nvme"
    k = make_key(2)
    m = ObjectMeta(b"p", tuple(range(16)), (b"h",), 16)
    d.mkdir()
    (d / k.digest()).write_bytes(_file(k, m.to_bytes()))
    t = NvmeTier(d, HUGE)
    assert t.dropped_at_start == [] and t.object_meta(k) == m


def test_flipped_metadata_byte_on_disk_is_dropped_at_start(tmp_path: Path) -> None:
    d = tmp_path / "nvme"
    tier = NvmeTier(d, HUGE)
    k, v = make_key(1), make_payload(1)
    m = ObjectMeta(b"p" * 16, tuple(range(16)), (b"h" * 16,), 16)
    assert tier.put([(k, v)], [m]) == [True]
    f = d / k.digest()
    blob = bytearray(f.read_bytes())
    h = codec.blob_meta(bytes(blob))
    at = len(blob) - h.stored - h.meta_len + 40  # inside the tokens
    blob[at] ^= 0x01
    f.write_bytes(bytes(blob))
    tier.close()  # a restart: one live store per directory
    assert NvmeTier(d, HUGE).held_keys() == []


# ------------------------------------------------------------------ SIGKILL mid-write
ROUNDS = 20
NKEYS = 12


def _op(seed: int, n: int) -> tuple[ObjectKey, int]:
    r = random.Random(seed * 1_000_003 + n)
    return make_key(r.randrange(NKEYS), list(K)[r.randrange(3)]), n


def _meta(key: ObjectKey, version: int) -> ObjectMeta:
    if key.kind is K.STATE:
        return ObjectMeta(key.prefix, (), (), version + 1)  # the version in block_size
    return ObjectMeta(b"", tuple([version] * 16), (b"h",), 16)


def _version_of(meta: ObjectMeta | None) -> int | None:
    if meta is None:
        return None
    return meta.block_size - 1 if not meta.tokens else meta.tokens[0]


def _child(path: Path, seed: int, start: int, wfd: int) -> None:  # pragma: no cover
    tier = NvmeTier(path, HUGE)
    n = start
    while True:
        key, version = _op(seed, n)
        rng = random.Random(n)
        size = rng.randrange(1, 1 << 17)  # up to 1 MiB of int64: the write takes a while
        payload = torch.from_numpy(np.full(size, version, np.int64))  # no torch pools after fork
        assert tier.put([(key, payload)], [_meta(key, version)]) == [True]
        os.write(wfd, f"{n}\n".encode())
        n += 1


def _round(path: Path, seed: int, start: int, delay: float) -> int:
    # the kill clock starts at the first report: a slow start on a busy host eats no time
    buf = fork_and_kill(lambda wfd: _child(path, seed, start, wfd), delay, from_first_report=True)
    return len(buf.split(b"\n")[:-1])


def test_sigkill_mid_write_never_mixes_metadata_and_payload_versions(tmp_path: Path) -> None:
    """After every kill and restart each object's metadata is the version its payload
    is, that version is the last completed put or the one in flight, and nothing torn
    is ever visible."""
    path = tmp_path / "nvme"
    rnd = random.Random(99)
    seed, n, torn = 3, 0, 0
    expected: dict[ObjectKey, int] = {}
    for _ in range(ROUNDS):
        done = _round(path, seed, n, rnd.uniform(0.0, 0.1))
        for i in range(n, n + done):
            key, version = _op(seed, i)
            expected[key] = version
        n += done
        fkey, fversion = _op(seed, n)  # possibly in flight
        torn += any(p.name.endswith(".tmp") for p in path.iterdir())
        tier = NvmeTier(path, HUGE)
        assert tier.dropped_at_start == []
        assert not [p for p in path.iterdir() if p.name.endswith(".tmp")]
        for key, _, meta in tier.inventory():
            version = _version_of(meta)
            got = tier.get([key])[0]
            assert got is not None and same_bits(got, torch.full_like(got, version or 0))
            ok = {expected.get(key)} | ({fversion} if key == fkey else set())
            assert version in ok, (key, version, ok)
            expected[key] = version  # type: ignore[assignment]
        assert set(tier.held_keys()) == set(expected)
        tier.close()
    assert n > ROUNDS  # the children made progress
    assert torn >= ROUNDS // 10  # the kills really hit writes in progress
