"""CUDA kernels against the torch path on the same CUDA tensors (bit-identical).

Skipped without a GPU; ``benchmarks/gpu/run_all.sh`` runs it on a GPU machine, where
it fails if no kernel launcher (CuPy or nvcc) is available rather than silently
testing torch against itself.
"""

from __future__ import annotations

import random

import pytest
import torch

from hybrid_connector import kernels
from hybrid_connector.tiers.copy_engine import CopyEngine, LayerTransfer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DEV = "cuda"
FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def _both(fn):  # type: ignore[no-untyped-def]
    """Run ``fn`` with the CUDA kernels and with the torch path."""
    out_k = fn()
    with kernels.torch_only():
        out_t = fn()
    torch.cuda.synchronize()
    return out_k, out_t


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def test_a_kernel_launcher_is_active() -> None:
    t = torch.zeros(1, device=DEV)
    assert kernels.backend_name(t) in ("cupy", "cubin"), "install cupy or put nvcc on PATH"


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("src", FLOATS)
def test_pack_unpack_bit_identical(seed: int, src: torch.dtype) -> None:
    rng = random.Random(seed)
    tokens = rng.randint(1, 700)
    hidden = rng.choice([1, 7, 13, 64, 1000, 4096])  # unaligned rows take the narrow paths
    g = torch.Generator(device=DEV).manual_seed(seed)
    base = torch.randn(tokens, hidden + 3, device=DEV, generator=g) * 10 ** rng.uniform(-3, 3)
    h = base[:, 1 : hidden + 1].to(src)  # offset start: misaligned pointer
    pos = [rng.randrange(tokens) for _ in range(rng.randint(0, 300))] + [tokens - 1]
    for dtype in [*FLOATS, torch.float8_e4m3fn]:
        pk, pt = _both(lambda dtype=dtype: kernels.pack_anchors(h, pos, dtype=dtype))
        assert torch.equal(_bits(pk.data), _bits(pt.data)), dtype
        if pk.scale is not None:
            assert pt.scale is not None and torch.equal(pk.scale, pt.scale)
        upos = rng.sample(range(tokens), len(pos)) if len(pos) <= tokens else None
        if upos is None:
            continue
        for dst_dtype in FLOATS:
            dk = torch.zeros(tokens, hidden, dtype=dst_dtype, device=DEV)
            dt = dk.clone()
            kernels.unpack_anchors(pk, dk, upos)
            with kernels.torch_only():
                kernels.unpack_anchors(pk, dt, upos)
            torch.cuda.synchronize()
            assert torch.equal(_bits(dk), _bits(dt)), (dtype, dst_dtype)


@pytest.mark.parametrize("layout", ["flash_attn", "flashinfer"])
@pytest.mark.parametrize("hnd", [False, True])
@pytest.mark.parametrize(("bs", "h", "d", "dtype"), [(16, 8, 128, torch.bfloat16), (16, 2, 64, torch.float16), (5, 3, 3, torch.float16), (32, 1, 576, torch.uint8)])
def test_paged_kv_bit_identical(layout: str, hnd: bool, bs: int, h: int, d: int, dtype: torch.dtype) -> None:
    nb = 257
    lead = (2, nb) if layout == "flash_attn" else (nb, 2)
    shape = (*lead, h, bs, d) if hnd else (*lead, bs, h, d)
    raw = torch.randint(0, 256, shape, dtype=torch.uint8, device=DEV)
    cache = raw if dtype == torch.uint8 else raw.to(dtype)
    if hnd:
        cache = cache.permute(0, 1, 3, 2, 4)
    rng = random.Random(bs * h)
    ids = rng.sample(range(nb), 40) + [nb - 1]
    bk, bt = _both(lambda: kernels.gather_kv_blocks(cache, ids, layout=layout))
    assert torch.equal(_bits(bk), _bits(bt))
    ck, ct = cache.clone(), cache.clone()
    new = torch.randint(0, 256, tuple(bk.shape), dtype=torch.uint8, device=DEV).to(dtype)
    kernels.scatter_kv_blocks(ck, ids, new, layout=layout)
    with kernels.torch_only():
        kernels.scatter_kv_blocks(ct, ids, new, layout=layout)
    torch.cuda.synchronize()
    assert torch.equal(_bits(ck), _bits(ct))


@pytest.mark.parametrize("aligned", [True, False])
def test_state_pages_bit_identical(aligned: bool) -> None:
    slots = 64
    conv_elems, ssm_elems = 3 * 1024, 16 * 64 * 64 if aligned else 7 * 13 * 5
    pad = 64 if aligned else 3
    page = conv_elems + ssm_elems + pad
    raw = torch.randn(slots * page, device=DEV)
    conv = raw.as_strided((slots, 3, 1024), (page, 1024, 1))
    ssm = raw.as_strided((slots, ssm_elems), (page, 1), conv_elems)
    src, dst = list(range(0, 20)), list(range(30, 50))
    rk, rt = raw.clone(), raw.clone()
    views = lambda r: [r.as_strided(conv.shape, conv.stride()), r.as_strided(ssm.shape, ssm.stride(), conv_elems)]  # noqa: E731
    kernels.copy_state_pages(views(rk), views(rk), src, dst)
    with kernels.torch_only():
        kernels.copy_state_pages(views(rt), views(rt), src, dst)
    torch.cuda.synchronize()
    assert torch.equal(rk, rt)
    assert not torch.equal(rk, raw)


def test_copy_engine_cuda_stream_ordering() -> None:
    """Consumers on the compute stream read each layer only after its event."""
    n, numel = 16, 1 << 20
    host = [torch.full((numel,), float(i + 1)).pin_memory() for i in range(n)]
    dsts = [torch.zeros(numel, device=DEV) for _ in range(n)]
    sums = torch.zeros(n, device=DEV)
    with CopyEngine(max_workers=2, device=DEV) as engine:
        job = engine.submit_layers(
            [LayerTransfer(f"l{i}", dst=dsts[i], src=host[i]) if i % 2 else
             LayerTransfer(f"l{i}", dst=dsts[i], fetch=lambda i=i: host[i]) for i in range(n)]
        )
        for i in range(n):
            job.wait(f"l{i}")
            sums[i] = dsts[i].sum()  # enqueued on the current stream after the event
        torch.cuda.synchronize()
    assert sums.tolist() == [float((i + 1) * numel) for i in range(n)]
