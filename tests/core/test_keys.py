import subprocess
import sys

import blake3
import numpy as np
import pytest

from hybrid_connector.keys import (
    ROOT_HASH,
    ObjectKey,
    ObjectKind,
    PrefixHasher,
    chain_hashes,
    model_fingerprint,
    prefix_hash,
)


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
    code = ("from hybrid_connector.keys import PrefixHasher;"
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
