import struct
import subprocess
import sys

import blake3
import numpy as np
import pytest

from hybrid_connector.core.keys import (
    ROOT_HASH,
    ObjectKey,
    ObjectKind,
    PrefixHasher,
    chain_hashes,
    model_fingerprint,
    prefix_hash,
)
from hybrid_connector.core.meta import ObjectMeta


def test_chain_matches_hand_computation():
    toks = list(range(40))
    h1 = blake3.blake3(bytes(16) + np.arange(16, dtype="<i8").tobytes()).digest(16)
    h2 = blake3.blake3(h1 + np.arange(16, 32, dtype="<i8").tobytes()).digest(16)
    assert chain_hashes(toks, 16) == [h1, h2]


def test_prefix_hash_consistent_with_chain_and_cut_independent():
    toks = np.random.default_rng(0).integers(0, 50000, 100)
    ph = PrefixHasher(toks, 16)
    assert ph.at(0) == ROOT_HASH
    assert ph.at(32) == chain_hashes(toks, 16)[1]
    # a prefix hash depends only on the prefix, not on the rest of the sequence
    assert ph.at(37) == PrefixHasher(toks[:37], 16).at(37) == prefix_hash(toks, 37, 16)
    ends = [ph.at(e) for e in range(101)]
    assert len(set(ends)) == 101
    with pytest.raises(ValueError):
        ph.at(101)


def test_hash_stable_across_processes():
    code = ("from hybrid_connector.core.keys import PrefixHasher;"
            "print(PrefixHasher(list(range(1000)), 16).at(999).hex())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": str(i)}).stdout for i in (1, 2)}
    assert outs == {PrefixHasher(list(range(1000)), 16).at(999).hex() + "\n"}


def test_bad_tokens_rejected():
    with pytest.raises(ValueError):
        chain_hashes([[1, 2]], 16)
    with pytest.raises(ValueError):
        chain_hashes([1, -2], 16)
    with pytest.raises(ValueError):
        chain_hashes([1, 2], 0)


def test_object_key_roundtrip_and_digest():
    k = ObjectKey("abcd", b"\x01" * 16, ObjectKind.KV, 0, 256)
    assert ObjectKey.from_str(k.to_str()) == k
    other = ObjectKey("abcd", b"\x01" * 16, ObjectKind.KV, 128, 256)
    assert k.digest() != other.digest()
    with pytest.raises(ValueError):
        ObjectKey.from_str("garbage")
    with pytest.raises(ValueError):
        ObjectKey("abcd", b"", ObjectKind.KV, 5, 4)


def test_fingerprint_changes_with_any_field():
    base = {"hidden": 64, "dtype": "bfloat16", "tp": 1}
    fp = model_fingerprint(base)
    assert model_fingerprint(dict(base)) == fp
    for k, v in (("hidden", 65), ("dtype", "float16"), ("tp", 2)):
        assert model_fingerprint({**base, k: v}) != fp


@pytest.mark.parametrize(("field", "args"), [
    ("fingerprint", ("a@b", b"\x01" * 16, ObjectKind.KV, 0, 16)),  # '@' splits to_str
    ("fingerprint", ("f" * (64 * 1024 + 1), b"\x01" * 16, ObjectKind.KV, 0, 16)),
    ("fingerprint", ("", b"\x01" * 16, ObjectKind.KV, 0, 16)),
    ("fingerprint", ("has space", b"\x01" * 16, ObjectKind.KV, 0, 16)),
    ("fingerprint", ("caf\u00e9", b"\x01" * 16, ObjectKind.KV, 0, 16)),
    ("fingerprint", (b"fp", b"\x01" * 16, ObjectKind.KV, 0, 16)),
    ("prefix", ("fp", "0101", ObjectKind.KV, 0, 16)),
    ("prefix", ("fp", b"\x01" * 65, ObjectKind.KV, 0, 16)),
    ("kind", ("fp", b"\x01" * 16, "kv", 0, 16)),
    ("kind", ("fp", b"\x01" * 16, None, 0, 16)),
    ("start", ("fp", b"\x01" * 16, ObjectKind.KV, -1, 16)),
    ("start", ("fp", b"\x01" * 16, ObjectKind.KV, 1.0, 16)),
    ("start", ("fp", b"\x01" * 16, ObjectKind.KV, True, 16)),
    ("end", ("fp", b"\x01" * 16, ObjectKind.KV, 0, "16")),
    ("end", ("fp", b"\x01" * 16, ObjectKind.KV, 0, 1 << 64)),
])
def test_object_key_rejects_bad_fields_when_made(field: str, args: tuple[object, ...]) -> None:
    """A key that could not round-trip (``to_str``/``from_str``, file and remote names)
    or be stored must not be made at all: ValueError naming the field."""
    with pytest.raises(ValueError, match=field):
        ObjectKey(*args)  # type: ignore[arg-type]


def test_object_key_limits_round_trip() -> None:
    """The largest valid fields survive ``to_str``/``from_str``; numpy integers are taken
    as plain ints (positions often come out of numpy arrays)."""
    k = ObjectKey("F" * 256, b"\xff" * 64, ObjectKind.ANCHOR, 0, (1 << 63) - 1)
    assert ObjectKey.from_str(k.to_str()) == k
    n = ObjectKey("fp", b"", ObjectKind.STATE, np.int64(7), np.int64(7))
    assert type(n.start) is int and n == ObjectKey("fp", b"", ObjectKind.STATE, 7, 7)
    with pytest.raises(ValueError):
        ObjectKey.from_str("fp@kv@0@16@zz")


# ------------------------------------------------------------------ ObjectMeta (warm restart)
def _seq(n: int = 1024, hi: int = 150_000) -> np.ndarray:
    return np.random.default_rng(3).integers(0, hi, n)


def test_object_meta_for_range_kv_chain_re_links() -> None:
    """A KV chunk's ``prev`` is the key prefix of the chunk before it, and its hashes are
    the prefix hashes at every block end in (start, end]: what an index needs to re-link
    chunks, and place states and anchors inside them, from the objects alone."""
    toks = _seq()
    h = PrefixHasher(toks, 16)
    a = ObjectMeta.for_range(toks, 0, 256, ObjectKind.KV, h)
    b = ObjectMeta.for_range(None, 256, 512, ObjectKind.KV, h)
    assert a.prev == ROOT_HASH and b.prev == h.at(256)  # == the key prefix of chunk a
    assert b.tokens == tuple(toks[256:512].tolist()) and b.block_size == 16
    assert b.hashes == tuple(h.at(p) for p in range(272, 513, 16))
    kb = ObjectKey("fp", h.at(512), ObjectKind.KV, 256, 512)
    assert b.check_key(kb) is None
    # a chunk that does not start on a block boundary: hashes at the block ends inside it
    c = ObjectMeta.for_range(toks, 100, 300, ObjectKind.ANCHOR, h)
    assert c.hashes == tuple(h.at(p) for p in (112, 128, 144, 160, 176, 192, 208, 224, 240,
                                               256, 272, 288))
    s = ObjectMeta.for_range(toks, 300, 300, ObjectKind.STATE, h)
    assert (s.prev, s.tokens, s.hashes) == (h.at(300), (), ())
    assert s.check_key(ObjectKey("fp", h.at(300), ObjectKind.STATE, 300, 300)) is None
    with pytest.raises(ValueError, match="range"):
        ObjectMeta.for_range(toks, 0, 2000, ObjectKind.KV, h)
    with pytest.raises(ValueError, match="state"):
        ObjectMeta.for_range(toks, 0, 16, ObjectKind.STATE, h)


def test_object_meta_check_key_names_the_mismatch() -> None:
    toks = _seq()
    h = PrefixHasher(toks, 16)
    m = ObjectMeta.for_range(toks, 256, 512, ObjectKind.KV, h)
    assert "tokens" in str(m.check_key(ObjectKey("fp", b"", ObjectKind.KV, 256, 500)))
    hash_only = ObjectMeta(h.at(256), (), m.hashes, 16)  # a writer that never saw tokens
    assert hash_only.check_key(ObjectKey("fp", b"", ObjectKind.KV, 256, 512)) is None
    assert "hashes" in str(hash_only.check_key(ObjectKey("fp", b"", ObjectKind.KV, 256, 528)))
    st = ObjectMeta.for_range(toks, 300, 300, ObjectKind.STATE, h)
    assert "prefix" in str(st.check_key(ObjectKey("fp", h.at(301), ObjectKind.STATE, 301, 301)))
    assert "state" in str(m.check_key(ObjectKey("fp", h.at(512), ObjectKind.STATE, 512, 512)))


@pytest.mark.parametrize("meta", [
    ObjectMeta(b""),
    ObjectMeta(b"\x07" * 64, (0, 1, 65535), (b"\x01" * 64,), 1),
    ObjectMeta(b"p", tuple(range(70_000, 70_256)), tuple(bytes([i]) * 16 for i in range(16)), 16),
    ObjectMeta(b"p", ((1 << 63) - 1, 0), (), 0),  # 8-byte tokens
    ObjectMeta(b"p", (5,), (b"a", b"bcd", b""), 3),  # hashes of mixed lengths
    ObjectMeta(b"p", (), (b"", b""), 7),  # empty hashes
])
def test_object_meta_bytes_round_trip(meta: ObjectMeta) -> None:
    back = ObjectMeta.from_bytes(meta.to_bytes())
    assert back == meta and hash(back) == hash(meta)
    assert all(type(t) is int for t in back.tokens)


def test_object_meta_is_compact() -> None:
    """A 256-token chunk (vocabulary above 65,536: 4-byte tokens) with 16 block hashes of
    16 bytes costs 1,316 bytes: 20 head + 16 prev + 1,024 tokens + 256 hashes."""
    toks = _seq()
    m = ObjectMeta.for_range(toks, 256, 512, ObjectKind.KV, PrefixHasher(toks, 16))
    assert len(m.to_bytes()) == 1316
    small = ObjectMeta.for_range(_seq(hi=32_000), 0, 256, ObjectKind.KV,
                                 PrefixHasher(_seq(hi=32_000), 256))
    assert len(small.to_bytes()) == 20 + 16 + 512 + 16  # 2-byte tokens, one hash


@pytest.mark.parametrize(("field", "kwargs"), [
    ("prev", {"prev": "00"}),
    ("prev", {"prev": b"\x00" * 65}),
    ("tokens", {"tokens": (1, -1)}),
    ("tokens", {"tokens": (1.0,)}),
    ("tokens", {"tokens": (True,)}),
    ("tokens", {"tokens": (1 << 63,)}),
    ("tokens", {"tokens": "abc"}),
    ("tokens", {"tokens": np.array([1.5])}),
    ("tokens", {"tokens": range((1 << 20) + 1)}),
    ("hashes", {"hashes": (b"\x00" * 65,), "block_size": 1}),
    ("hashes", {"hashes": ("ab",), "block_size": 1}),
    ("hashes", {"hashes": b"ab", "block_size": 1}),
    ("hashes", {"hashes": [b""] * ((1 << 16) + 1), "block_size": 1}),
    ("hashes", {"hashes": (b"a",)}),  # hashes without a block size
    ("block_size", {"block_size": -1}),
    ("block_size", {"block_size": 2.0}),
    ("block_size", {"block_size": 1 << 63}),
])
def test_object_meta_rejects_bad_fields(field: str, kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"prev": b"", **kwargs}
    with pytest.raises(ValueError, match=field):
        ObjectMeta(**args)  # type: ignore[arg-type]


def test_object_meta_accepts_lists_and_numpy() -> None:
    m = ObjectMeta(b"", [np.int64(3), 4], [b"x"], np.int32(2))  # type: ignore[arg-type]
    assert m.tokens == (3, 4) and m.hashes == (b"x",) and type(m.block_size) is int
    assert ObjectMeta(b"", np.arange(5)).tokens == (0, 1, 2, 3, 4)  # type: ignore[arg-type]


def _head(version: int = 1, plen: int = 0, hlen: int = 0, width: int = 0, bs: int = 0,
          ntok: int = 0, nh: int = 0) -> bytes:
    return struct.pack("<BBBBQII", version, plen, hlen, width, bs, ntok, nh)


@pytest.mark.parametrize("blob", [
    b"",
    b"\x01\x00",
    _head(version=2),
    _head(plen=65),
    _head(hlen=65, nh=1, bs=1) + b"x" * 65,
    _head(width=3, ntok=1) + b"abc",
    _head(width=0, ntok=1),
    _head(width=4, ntok=0),
    _head(width=4, ntok=0xFFFFFFFF),  # 16 GiB of tokens claimed, none there
    _head(width=4, ntok=(1 << 20) + 1) + bytes(4 * ((1 << 20) + 1)),
    _head(hlen=16, nh=0xFFFFFFFF, bs=16),
    _head(width=2, ntok=2) + b"\x00\x00",  # short
    _head(width=2, ntok=1) + b"\x00\x00\x00",  # trailing byte
    _head(width=8, ntok=1) + b"\xff" * 8,  # a token above int64
    _head(hlen=0xFF, nh=2, bs=1) + b"\x03ab",  # a length byte running past the end
    _head(hlen=0xFF, nh=1, bs=1) + b"\x41" + b"a" * 65,  # a hash above 64 bytes
    _head(hlen=0xFF, nh=1, bs=1) + b"\x01ab",  # left over
    _head(hlen=4, nh=1, bs=0) + b"abcd",  # hashes without block size
    _head(bs=1 << 63),
])
def test_object_meta_from_bytes_rejects_hostile_input(blob: bytes) -> None:
    """Crafted lengths are refused from the head, before anything is allocated."""
    with pytest.raises(ValueError, match="meta"):
        ObjectMeta.from_bytes(blob)
