"""The CUDA path (wrappers + .cu kernels) run on the host against the torch path.

Without a GPU this is how the CUDA code is exercised: ``HostLauncher`` compiles the
real kernel sources for the CPU and the wrappers hand it the same raw addresses,
strides and launch shapes they hand CuPy. Every result must be bit-identical to the
torch fallback, as on a GPU.
"""

from __future__ import annotations

import random

import pytest
import torch
from kernels_host_launcher import HostLauncher

from hybrid_connector import kernels

FLOATS = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def host() -> HostLauncher:
    try:
        return HostLauncher()
    except RuntimeError as exc:
        pytest.skip(str(exc))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("seed", range(3))
def test_pack_unpack_identical(host: HostLauncher, seed: int) -> None:
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    tokens = rng.randint(1, 30)
    hidden = [5, 16, 40][seed]  # 1-, 4- and 16-byte vector paths
    for src_dtype in FLOATS:
        base = torch.randn(tokens, hidden + 2, generator=g) * torch.exp(torch.randn(tokens, 1, generator=g) * 4)
        h = base[:, 1 : hidden + 1].to(src_dtype)  # strided rows, offset start
        pos = [rng.randrange(tokens) for _ in range(rng.randint(0, 6))]
        for dtype in [*FLOATS, torch.float8_e4m3fn]:
            with kernels.use_launcher(host):
                pk = kernels.pack_anchors(h, pos, dtype=dtype)
            pt = kernels.pack_anchors(h, pos, dtype=dtype)
            assert torch.equal(_bits(pk.data), _bits(pt.data)), (src_dtype, dtype)
            if pt.scale is not None:
                assert pk.scale is not None and torch.equal(pk.scale, pt.scale)
            upos = rng.sample(range(tokens), len(pos)) if len(pos) <= tokens else list(range(len(pos)))[:0]
            if len(upos) != len(pos):
                continue
            for dst_dtype in FLOATS:
                dk = torch.randn(tokens, hidden, generator=g).to(dst_dtype)
                dt = dk.clone()
                with kernels.use_launcher(host):
                    kernels.unpack_anchors(pk, dk, upos)
                kernels.unpack_anchors(pt, dt, upos)
                assert torch.equal(_bits(dk), _bits(dt)), (dtype, dst_dtype)
    used = {k for k, _, _ in host.launches}
    assert {"hc_rows_copy_v1", "hc_rows_convert_2_0", "hc_rows_quant_e4m3_2", "hc_rows_convert_3_1"} <= used


@pytest.mark.parametrize("layout", ["flash_attn", "flashinfer"])
@pytest.mark.parametrize("hnd", [False, True])
@pytest.mark.parametrize(("bs", "h", "d", "dtype"), [(16, 2, 8, torch.bfloat16), (3, 3, 5, torch.float16), (4, 1, 4, torch.uint8)])
def test_paged_kv_identical(host: HostLauncher, layout: str, hnd: bool, bs: int, h: int, d: int, dtype: torch.dtype) -> None:
    nb = 9
    lead = (2, nb) if layout == "flash_attn" else (nb, 2)
    shape = (*lead, h, bs, d) if hnd else (*lead, bs, h, d)
    cache = torch.randint(0, 256, shape, dtype=torch.uint8).to(dtype)
    if hnd:
        cache = cache.permute(0, 1, 3, 2, 4)
    ids = [nb - 1, 0, 4, 4]
    with kernels.use_launcher(host):
        bk = kernels.gather_kv_blocks(cache, ids, layout=layout)
    bt = kernels.gather_kv_blocks(cache, ids, layout=layout)
    assert torch.equal(_bits(bk), _bits(bt))
    new = torch.randint(0, 256, (2, 3, bs, h, d), dtype=torch.uint8).to(dtype)
    ck, ct = cache.clone(), cache.clone()
    with kernels.use_launcher(host):
        kernels.scatter_kv_blocks(ck, [nb - 1, 2, 0], new, layout=layout)
    kernels.scatter_kv_blocks(ct, [nb - 1, 2, 0], new, layout=layout)
    assert torch.equal(_bits(ck), _bits(ct))


@pytest.mark.parametrize("odd", [False, True])
def test_state_pages_identical(host: HostLauncher, odd: bool) -> None:
    slots = 10
    conv_elems = 7 if odd else 3 * 16
    ssm_elems = 3 * 5 if odd else 17000  # > CHUNK_BYTES / 4: pages split into chunks
    page = conv_elems + ssm_elems + (1 if odd else 4)
    raw = torch.randn(slots * page)
    views = lambda r: [  # noqa: E731
        r.as_strided((slots, conv_elems), (page, 1)),
        r.as_strided((slots, ssm_elems), (page, 1), conv_elems),
    ]
    rk, rt = raw.clone(), raw.clone()
    with kernels.use_launcher(host):
        kernels.copy_state_pages(views(rk), views(rk), [0, 1, 1], [5, 9, 7])
    kernels.copy_state_pages(views(rt), views(rt), [0, 1, 1], [5, 9, 7])
    assert torch.equal(rk, rt) and not torch.equal(rk, raw)
    kernel = {k for k, _, _ in host.launches if k.startswith("hc_copy_pages")}
    assert kernel
