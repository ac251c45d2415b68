"""Anchor pack/unpack: torch fallback against the python reference."""

from __future__ import annotations

import random

import pytest
import torch
from kernels_reference import e4m3_value, ref_pack

from hybrid_connector import kernels
from hybrid_connector.kernels import PackedAnchors

FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def _hidden(tokens: int, hidden: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # A wide dynamic range per row exercises scaling and e4m3 subnormals.
    x = torch.randn(tokens, hidden, generator=g) * torch.exp(torch.randn(tokens, 1, generator=g) * 3)
    return x.to(dtype)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("src", FLOATS)
def test_pack_matches_reference_all_dtypes(seed: int, src: torch.dtype) -> None:
    rng = random.Random(seed)
    tokens, hidden = rng.randint(1, 40), rng.choice([1, 3, 8, 13, 64])
    h = _hidden(tokens, hidden, src, seed)
    positions = [rng.randrange(tokens) for _ in range(rng.randint(0, 12))]
    for dtype in [*FLOATS, torch.float8_e4m3fn]:
        packed = kernels.pack_anchors(h, positions, dtype=dtype)
        want, want_scale = ref_pack(h, positions, dtype)
        assert packed.data.shape == (len(positions), hidden)
        assert packed.data.dtype == dtype
        assert torch.equal(packed.data.view(torch.uint8) if dtype.itemsize == 1 else packed.data, want.view(torch.uint8) if dtype.itemsize == 1 else want), dtype
        if want_scale is None:
            assert packed.scale is None
        else:
            assert packed.scale is not None
            assert packed.scale.tolist() == want_scale


def test_pack_duplicates_and_largest_position() -> None:
    h = _hidden(17, 24, torch.bfloat16, 1)
    packed = kernels.pack_anchors(h, [16, 16, 0, 16])
    assert torch.equal(packed.data[0], h[16]) and torch.equal(packed.data[3], h[16])
    assert torch.equal(packed.data[2], h[0])


def test_pack_non_contiguous_rows_and_out_buffer() -> None:
    base = _hidden(30, 20, torch.float16, 2)
    h = base[::3, 2:18]  # row stride 60, inner dim dense
    out = torch.full((4, 16), 7.0, dtype=torch.float16)
    packed = kernels.pack_anchors(h, torch.tensor([9, 0, 5, 2]), out=out)
    assert packed.data is out
    assert torch.equal(out, torch.stack([h[9], h[0], h[5], h[2]]))


def test_fp8_round_trip_tolerance() -> None:
    h = _hidden(64, 96, torch.float32, 3)
    h[5] = 0.0  # all-zero row: scale 1, exact zeros back
    pos = list(range(0, 64, 3))
    packed = kernels.pack_anchors(h, pos, dtype=torch.float8_e4m3fn)
    back = torch.zeros_like(h)
    kernels.unpack_anchors(packed, back, pos)
    assert packed.scale is not None
    for i, p in enumerate(pos):
        err = (back[p] - h[p]).abs()
        bound = h[p].abs() * 2.0**-4 + float(packed.scale[i]) * 2.0**-10 + 1e-30
        assert bool((err <= bound * (1 + 1e-6)).all()), (p, float((err - bound).max()))
    assert bool((back[5] == 0).all())
    # rows not addressed stay untouched
    assert bool((back[1] == 0).all())
    # dequantisation is exactly code value * scale
    q = packed.data.view(torch.uint8)
    assert packed.scale is not None
    want = [[e4m3_value(int(c)) * float(packed.scale[0]) for c in q[0].tolist()]]
    assert torch.equal(back[pos[0]], torch.tensor(want[0], dtype=torch.float32))


DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_scale_is_the_correctly_rounded_quotient(device: str) -> None:
    """scale = amax / 448 rounded once, on every device and backend. On CUDA, torch's
    division by a Python float is a multiply by its reciprocal, which is an ulp off for
    these rows (the H200 run saw the kernels and the torch path disagree on it)."""
    amax = torch.rand(4096, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 1000
    amax = amax.to(torch.float32)
    via_reciprocal = amax * torch.tensor(1 / 448, dtype=torch.float32)
    want = (amax.double() / 448).to(torch.float32)
    rows = torch.nonzero(via_reciprocal != want).flatten()[:64]
    assert rows.numel() > 0  # the rows this test is about exist
    h = torch.zeros(rows.numel(), 8, dtype=torch.float32)
    h[:, 3] = -amax[rows]  # amax of |row|, one sign flipped
    h = h.to(device)
    packed = kernels.pack_anchors(h, list(range(rows.numel())), dtype=torch.float8_e4m3fn)
    assert packed.scale is not None
    assert torch.equal(packed.scale.cpu(), want[rows])


@pytest.mark.parametrize("dst_dtype", FLOATS)
def test_unpack_matches_loop_reference(dst_dtype: torch.dtype) -> None:
    rng = random.Random(7)
    h = _hidden(20, 11, torch.float32, 7)
    pos = rng.sample(range(20), 9)
    packed = kernels.pack_anchors(h, pos, dtype=torch.bfloat16)
    dst = torch.randn(20, 11).to(dst_dtype)
    before = dst.clone()
    kernels.unpack_anchors(packed, dst, pos)
    want = before.clone()
    for i, p in enumerate(pos):
        want[p] = packed.data[i].to(torch.float32).to(dst_dtype)
    assert torch.equal(dst, want)


def test_empty_selection() -> None:
    h = _hidden(5, 8, torch.bfloat16, 0)
    packed = kernels.pack_anchors(h, [], dtype=torch.float8_e4m3fn)
    assert packed.data.shape == (0, 8) and packed.scale is not None and packed.scale.shape == (0,)
    dst = h.clone()
    kernels.unpack_anchors(packed, dst, [])
    assert torch.equal(dst, h)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda h: kernels.pack_anchors(h, [5]), "outside the valid range"),
        (lambda h: kernels.pack_anchors(h, [-1]), "outside the valid range"),
        (lambda h: kernels.pack_anchors(h, torch.tensor([0.5])), "integer tensor"),
        (lambda h: kernels.pack_anchors(h[0], [0]), "2-D"),
        (lambda h: kernels.pack_anchors(h.to(torch.int32), [0]), "float32, float16 or bfloat16"),
        (lambda h: kernels.pack_anchors(h, [0], dtype=torch.int8), "pack dtype"),
        (lambda h: kernels.pack_anchors(h.t(), [0]), "dense"),
        (lambda h: kernels.pack_anchors(h, [0], out=torch.empty(2, 8)), "out must be"),
        (lambda h: kernels.unpack_anchors(h[:2], h.clone(), [1, 1]), "repeated"),
        (lambda h: kernels.unpack_anchors(h[:2], h.clone(), [1]), "positions for 2"),
        (lambda h: kernels.unpack_anchors(h[:2, :4].contiguous(), h.clone(), [0, 1]), "rows hold"),
        (
            lambda h: kernels.unpack_anchors(h[:1].to(torch.float8_e4m3fn), h.clone(), [0]),
            "scale is required",
        ),
    ],
)
def test_bad_input_raises_value_error(call, match: str) -> None:  # type: ignore[no-untyped-def]
    h = _hidden(5, 8, torch.float32, 0)
    keep = h.clone()
    with pytest.raises(ValueError, match=match):
        call(h)
    assert torch.equal(h, keep)


def test_packed_nbytes() -> None:
    p = PackedAnchors(torch.empty(3, 10, dtype=torch.float8_e4m3fn), torch.empty(3))
    assert p.nbytes == 30 + 12


def test_pack_groups_into_one_block() -> None:
    groups = [_hidden(12, 16, torch.bfloat16, g) for g in range(3)]
    pos = [2, 7, 11]
    buf = torch.empty(3, len(pos), 16, dtype=torch.float8_e4m3fn)
    scales = torch.empty(3, len(pos))
    for g, h in enumerate(groups):
        kernels.pack_anchors(h, pos, dtype=torch.float8_e4m3fn, out=buf[g], scale_out=scales[g])
    for g, h in enumerate(groups):
        alone = kernels.pack_anchors(h, pos, dtype=torch.float8_e4m3fn)
        assert alone.scale is not None
        assert torch.equal(buf[g].view(torch.uint8), alone.data.view(torch.uint8))
        assert torch.equal(scales[g], alone.scale)
