"""Paged KV gather/scatter: torch fallback against the python loop reference."""

from __future__ import annotations

import random

import pytest
import torch
from kernels_reference import ref_kv_gather, ref_kv_scatter

from hybrid_connector import kernels
from hybrid_connector.kernels.paged_kv import buffer_shape, layout_for_backend


def _cache(layout: str, nb: int, bs: int, h: int, d: int, dtype: torch.dtype, hnd: bool, seed: int) -> torch.Tensor:
    """A cache in vLLM's logical shape; ``hnd`` lays heads before tokens in memory."""
    g = torch.Generator().manual_seed(seed)
    lead = (2, nb) if layout == "flash_attn" else (nb, 2)
    if hnd:  # physical [.., .., H, BS, D] viewed as logical [.., .., BS, H, D]
        phys = torch.randn(*lead, h, bs, d, generator=g).to(dtype)
        return phys.permute(0, 1, 3, 2, 4)
    return torch.randn(*lead, bs, h, d, generator=g).to(dtype)


CASES = [
    # layout, blocks, block_size, heads, head_size, dtype, hnd
    ("flash_attn", 7, 16, 2, 8, torch.bfloat16, False),
    ("flashinfer", 7, 16, 2, 8, torch.bfloat16, False),
    ("flash_attn", 5, 3, 3, 5, torch.float16, True),  # unaligned sizes, HND strides
    ("flashinfer", 9, 4, 1, 7, torch.float32, True),
    ("flash_attn", 4, 2, 2, 4, torch.uint8, False),  # fp8 caches are stored as bytes
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", range(3))
def test_gather_matches_reference(case: tuple, seed: int) -> None:  # type: ignore[type-arg]
    layout, nb, bs, h, d, dtype, hnd = case
    if dtype == torch.uint8:
        cache = torch.randint(0, 256, (2, nb, bs, h, d), dtype=torch.uint8)
    else:
        cache = _cache(layout, nb, bs, h, d, dtype, hnd, seed)
    rng = random.Random(seed)
    ids = [rng.randrange(nb) for _ in range(rng.randint(1, 6))] + [nb - 1]  # repeats allowed
    before = cache.clone()
    buf = kernels.gather_kv_blocks(cache, ids, layout=layout)
    assert buf.is_contiguous() and buf.shape == buffer_shape(cache, len(ids), layout)
    assert torch.equal(buf, ref_kv_gather(cache, ids, layout))
    assert torch.equal(cache, before)  # gather never writes the cache


@pytest.mark.parametrize("case", CASES)
def test_scatter_matches_reference(case: tuple) -> None:  # type: ignore[type-arg]
    layout, nb, bs, h, d, dtype, hnd = case
    if dtype == torch.uint8:
        cache = torch.randint(0, 256, (2, nb, bs, h, d), dtype=torch.uint8)
        buf = torch.randint(0, 256, (2, 2, bs, h, d), dtype=torch.uint8)
    else:
        cache = _cache(layout, nb, bs, h, d, dtype, hnd, 1)
        buf = torch.randn(2, 2, bs, h, d).to(dtype)
    ids = [nb - 1, 0]  # largest block id included
    want = ref_kv_scatter(cache, ids, buf, layout)
    kernels.scatter_kv_blocks(cache, ids, buf, layout=layout)
    assert torch.equal(cache, want)


def test_round_trip_between_layouts() -> None:
    """A chunk saved from a FlashAttention cache loads into a FlashInfer HND cache."""
    src = _cache("flash_attn", 6, 16, 4, 16, torch.bfloat16, False, 3)
    dst = torch.zeros(6, 2, 4, 16, 16, dtype=torch.bfloat16).permute(0, 1, 3, 2, 4)
    chunk = kernels.gather_kv_blocks(src, [4, 1, 5])
    kernels.scatter_kv_blocks(dst, [0, 2, 3], chunk, layout="flashinfer")
    for s, t in zip([4, 1, 5], [0, 2, 3], strict=True):
        assert torch.equal(dst[t, 0], src[0, s]) and torch.equal(dst[t, 1], src[1, s])
    assert bool((dst[1] == 0).all()) and bool((dst[4] == 0).all())


def test_empty_block_list() -> None:
    cache = _cache("flash_attn", 3, 16, 1, 8, torch.float16, False, 0)
    buf = kernels.gather_kv_blocks(cache, [])
    assert buf.shape == (2, 0, 16, 1, 8)
    before = cache.clone()
    kernels.scatter_kv_blocks(cache, [], buf)
    assert torch.equal(cache, before)


def test_gather_into_preallocated_buffer() -> None:
    cache = _cache("flashinfer", 5, 16, 2, 8, torch.bfloat16, False, 4)
    out = torch.empty(2, 2, 16, 2, 8, dtype=torch.bfloat16)
    res = kernels.gather_kv_blocks(cache, torch.tensor([3, 3]), layout="flashinfer", out=out)
    assert res is out and torch.equal(out[0, 0], cache[3, 0]) and torch.equal(out[1, 1], cache[3, 1])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda c, b: kernels.gather_kv_blocks(c, [4]), "outside the valid range"),
        (lambda c, b: kernels.gather_kv_blocks(c, [0], layout="nhd"), "unknown KV layout"),
        (lambda c, b: kernels.gather_kv_blocks(c, [0], layout="flashinfer"), "expects size 2"),
        (lambda c, b: kernels.gather_kv_blocks(c[0], [0]), "5-D"),
        (lambda c, b: kernels.gather_kv_blocks(c.transpose(3, 4), [0]), "dense"),
        (lambda c, b: kernels.gather_kv_blocks(c, [0], out=b), "buffer must be"),
        (lambda c, b: kernels.scatter_kv_blocks(c, [1, 1], b), "repeated"),
        (lambda c, b: kernels.scatter_kv_blocks(c, [1, 2], b.to(torch.float32)), "buffer must be"),
        (lambda c, b: kernels.scatter_kv_blocks(c, [1], b), "buffer must be"),
    ],
)
def test_bad_input_raises_value_error(call, match: str) -> None:  # type: ignore[no-untyped-def]
    cache = _cache("flash_attn", 4, 16, 2, 8, torch.bfloat16, False, 0)
    buf = torch.zeros(2, 2, 16, 2, 8, dtype=torch.bfloat16)
    before = cache.clone()
    with pytest.raises(ValueError, match=match):
        call(cache, buf)
    assert torch.equal(cache, before)


def test_layout_for_backend_and_aliases() -> None:
    assert layout_for_backend(lambda nb, bs, h, d: (2, nb, bs, h, d)) == "kv_first"
    assert layout_for_backend(lambda nb, bs, h, d: (nb, 2, bs, h, d)) == "blocks_first"
    with pytest.raises(ValueError, match="unsupported"):
        layout_for_backend(lambda nb, bs, h, d: (nb, bs, d))  # MLA
    cache = _cache("flashinfer", 4, 16, 2, 8, torch.bfloat16, True, 0)
    assert torch.equal(
        kernels.gather_kv_blocks(cache, [3, 1], layout="blocks_first"),
        kernels.gather_kv_blocks(cache, [3, 1], layout="flashinfer"),
    )
