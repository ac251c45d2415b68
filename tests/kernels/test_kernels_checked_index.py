"""CheckedIndex: validated once, then passed to kernel calls without per-call checks."""

from __future__ import annotations

import pytest
import torch

from hybrid_connector import kernels
from hybrid_connector.integrations.hf import pack as hf_pack
from hybrid_connector.kernels import CheckedIndex

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", DEVICES)
def test_a_checked_index_moves_what_the_list_moves(device: str) -> None:
    h = torch.randn(50, 24, device=device)
    pos = [7, 3, 3, 49, 0]
    want = kernels.pack_anchors(h, pos).data
    assert torch.equal(kernels.pack_anchors(h, CheckedIndex.of(pos, device)).data, want)
    dst, ref = torch.zeros(60, 24, device=device), torch.zeros(60, 24, device=device)
    upos = [9, 2, 40, 11, 0]
    kernels.unpack_anchors(want, ref, [p + 5 for p in upos])
    kernels.unpack_anchors(want, dst, CheckedIndex.of(upos, device).shifted(5))
    assert torch.equal(dst, ref)


def test_bounds_and_uniqueness_are_enforced_from_what_was_checked() -> None:
    idx = CheckedIndex.of([4, 1, 4], "cpu")
    assert (idx.lo, idx.hi, idx.unique) == (1, 4, False)
    h = torch.randn(5, 8)
    kernels.pack_anchors(h, idx)  # a gather may repeat
    with pytest.raises(ValueError, match="repeated"):
        kernels.unpack_anchors(torch.zeros(3, 8), h, idx)
    with pytest.raises(ValueError, match="outside the valid range"):
        kernels.pack_anchors(torch.randn(4, 8), idx)
    with pytest.raises(ValueError, match="below 0"):
        CheckedIndex.of([0, -2], "cpu")
    with pytest.raises(ValueError, match="negative"):
        CheckedIndex.of([3, 1], "cpu").shifted(-2)
    with pytest.raises(ValueError, match="integer"):
        CheckedIndex.of(torch.tensor([0.5]), "cpu")
    assert CheckedIndex.of([], "cpu").shifted(3).numel() == 0


def test_hf_restores_check_each_chunk_shape_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The restore path's KV rows (t-major, so not increasing) were sorted on the host on
    every call to prove them unique: on an H200 that was the largest host cost of a load."""
    dst = torch.zeros(1, 2, 64, 16)
    part = torch.randn(16, 2, 16)
    hf_pack.scatter_kv(part, dst, 0)  # the first call of a shape checks its rows

    def no_sort(*_a: object, **_k: object) -> None:
        raise AssertionError("an index was sorted again")
    monkeypatch.setattr(torch, "unique", no_sort)
    for start in (16, 32, 48):
        hf_pack.scatter_kv(part, dst, start)
    assert torch.equal(dst[0, :, 48:64], part.transpose(0, 1))
    out = torch.empty(16, 2, 16)
    hf_pack.gather_kv(dst, 16, out)
    assert torch.equal(out, part)
    with pytest.raises(ValueError, match="do not fit"):
        hf_pack.scatter_kv(part, dst, 56)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_an_index_uploaded_on_one_stream_serves_another() -> None:
    idx = CheckedIndex.of(list(range(0, 4096, 2)), "cuda")
    src = torch.randn(2048, 64, device="cuda")
    dst = torch.zeros(4096, 64, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        kernels.unpack_anchors(src, dst, idx.shifted(1))
    torch.cuda.synchronize()
    assert torch.equal(dst[1::2], src) and not dst[0::2].any()
