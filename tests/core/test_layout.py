"""The one payload layout (``hybrid_connector.payload.layout``): agreement with the geometry's byte
figures for every preset, pack/unpack round trips and size errors, and the paged-KV view
through vLLM's two block layouts, bit for bit, on CPU."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from hybrid_connector import kernels
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.layers import TensorSpec
from hybrid_connector.geometry.model import AttentionDims, LayerSpec, Mamba2Dims, ModelGeometry
from hybrid_connector.geometry.presets import PRESETS, get_preset
from hybrid_connector.payload.layout import PayloadLayout, anchor_layout, kv_layout, state_layout
from hybrid_connector.payload.paged import gather_paged_kv, scatter_paged_kv
from hybrid_connector.policies.admission.anchors import anchor_block_bytes, anchor_keep


@contextmanager
def dispatches() -> Iterator[list[str]]:
    """Within the block, the name of every ``kernels`` function that reaches the dispatch
    point (``kernels._launcher_for``), in call order."""
    seen: list[str] = []
    inner = kernels._launcher_for

    def spy(t: torch.Tensor):  # type: ignore[no-untyped-def]
        import sys

        seen.append(sys._getframe(1).f_code.co_name)
        return inner(t)

    kernels._launcher_for = spy  # type: ignore[assignment]
    try:
        yield seen
    finally:
        kernels._launcher_for = inner  # type: ignore[assignment]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _fields(specs: object) -> list[tuple[str, tuple[int, ...], str]]:
    return [(s.name, tuple(s.shape), s.dtype) for s in specs]  # type: ignore[attr-defined]


def _random(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point and dtype.itemsize >= 2:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8).view(dtype)


# ------------------------------------------------------------------------------------------
# the layouts of a geometry


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("tp", [1, 2])
def test_layouts_are_the_geometry_bytes(name: str, tp: int) -> None:
    geo = get_preset(name, tp_size=tp)
    for n in (1, 7, 256):
        kv = kv_layout(geo, n)
        assert _fields(kv.parts) == _fields(kv_layout(geo, n).specs)
        assert kv.nbytes == n * geo.kv_bytes_per_token()
    st = state_layout(geo)
    assert _fields(st.parts) == _fields(state_layout(geo).specs)
    assert st.nbytes == geo.state_bytes()
    for lay in (kv_layout(geo, 5), st):
        off = 0
        for p in lay.parts:  # back to back, in order, no padding
            assert p.offset == off
            off = p.end
        assert off == lay.nbytes
    for page, rho in ((64, 0.25), (16, 1.0), (64, 1 / 64)):
        anc = anchor_layout(geo, page, rho)
        assert anc.nbytes == anchor_block_bytes(geo, page, rho)
        assert anc.keep == anchor_keep(geo, page, rho)
        assert [p.name for p in anc.payload.parts] == [f"group.{g[0]}" for g in geo.recurrent_groups()]
        assert all(p.shape == (anc.keep, geo.hidden_size) for p in anc.payload.parts)
        assert list(anc.positions(page)) == list(range(2 * page - anc.keep, 2 * page))


def test_jamba_anchor_keep_is_the_conv_minimum() -> None:
    """Jamba-1.5-Mini's groups are 7 Mamba layers (kernel 4) between attention layers: a page
    keeps 3 * 7 = 21 positions, more than ceil(0.25 * 64) = 16, in the cache's size check and
    in the runtime's layout alike (they once disagreed: 16 against 21)."""
    geo = get_preset("jamba-1.5-mini")
    assert max(len(g) for g in geo.recurrent_groups()) == 7
    assert anchor_layout(geo, 64, 0.25).keep == 21
    assert anchor_layout(geo, 64, 0.25).nbytes == 21 * geo.anchor_bytes_per_token()


# ------------------------------------------------------------------------------------------
# pack / unpack

MIXED = PayloadLayout.of(ObjectKind.STATE, [
    TensorSpec("conv", (3, 3), "bfloat16"),  # 18 bytes: the next part is not 4-byte aligned
    TensorSpec("rec", (2, 5), "float32"),
    TensorSpec("tail", (7,), "bfloat16"),
])


def test_pack_unpack_roundtrip_mixed_and_unaligned() -> None:
    parts = {p.name: _random(p.shape, p.torch_dtype, i) for i, p in enumerate(MIXED.parts)}
    with dispatches() as seen:
        payload = MIXED.pack(parts)
    assert seen == ["copy_state_pages"]  # one kernel call moves every part
    assert payload.dtype == torch.uint8 and payload.dim() == 1 and payload.numel() == MIXED.nbytes
    assert torch.equal(payload[:18], _bits(parts["conv"]))
    assert torch.equal(payload[18:58], _bits(parts["rec"]))
    out = MIXED.unpack(payload)
    assert list(out) == list(MIXED.names)
    for name, t in parts.items():
        assert out[name].dtype == t.dtype and torch.equal(_bits(out[name]), _bits(t))
    # the same bytes written in place through allocate/commit (a staging tensor for "rec")
    fresh, views = MIXED.allocate()
    for name, t in parts.items():
        views[name].copy_(t)
    assert torch.equal(MIXED.commit(fresh, views), payload)


def test_single_dtype_payload_keeps_its_dtype_and_accepts_raw_bytes() -> None:
    lay = PayloadLayout.of(ObjectKind.KV, [TensorSpec("layers.0.k", (4, 2, 3), "bfloat16"),
                                           TensorSpec("layers.0.v", (4, 2, 3), "bfloat16")])
    k, v = _random((4, 2, 3), torch.bfloat16, 1), _random((4, 2, 3), torch.bfloat16, 2)
    payload = lay.pack([k, v])
    assert payload.dtype == torch.bfloat16 and payload.numel() == 48
    for got in (lay.unpack(payload), lay.unpack(payload.view(torch.uint8))):
        assert torch.equal(got["layers.0.k"], k) and torch.equal(got["layers.0.v"], v)
    assert lay.unpack(payload)["layers.0.k"].data_ptr() == payload.data_ptr()  # a view


def test_size_and_shape_errors_name_the_part() -> None:
    good = MIXED.pack([_random(p.shape, p.torch_dtype, 0) for p in MIXED.parts])
    with pytest.raises(ValueError, match=r"ends inside part 'rec' \(bytes \[18, 58\)\)"):
        MIXED.unpack(good[:30])
    with pytest.raises(ValueError, match="expects 72: 3 bytes follow the last part 'tail'"):
        MIXED.unpack(torch.cat([good, good[:3]]))
    with pytest.raises(ValueError, match="dtype torch.float32; its layout expects torch.uint8"):
        MIXED.unpack(torch.zeros(18))
    with pytest.raises(ValueError, match=r"part 'rec' is \(5, 2\) torch.float32, expected \(2, 5\)"):
        MIXED.pack({"conv": torch.zeros(3, 3, dtype=torch.bfloat16), "rec": torch.zeros(5, 2),
                    "tail": torch.zeros(7, dtype=torch.bfloat16)})
    with pytest.raises(ValueError, match=r"part 'tail' is \(7,\) torch.float32"):
        MIXED.pack([torch.zeros(3, 3, dtype=torch.bfloat16), torch.zeros(2, 5), torch.zeros(7)])
    with pytest.raises(ValueError, match=r"missing parts \['tail'\], unknown parts \['extra'\]"):
        MIXED.pack({"conv": torch.zeros(3, 3, dtype=torch.bfloat16), "rec": torch.zeros(2, 5),
                    "extra": torch.zeros(1)})
    with pytest.raises(ValueError, match="has no part 'nope'"):
        MIXED.part("nope")
    with pytest.raises(ValueError, match="repeated part names"):
        PayloadLayout.of(ObjectKind.KV, [TensorSpec("a", (1,), "float32")] * 2)


# ------------------------------------------------------------------------------------------
# paged KV (vLLM block tables)


def _paged_geometry() -> ModelGeometry:
    layers = [LayerSpec(0, "mamba2", "none"), LayerSpec(1, "attention", "none"),
              LayerSpec(2, "mamba2", "none"), LayerSpec(3, "attention", "none")]
    return ModelGeometry(
        name="paged-test", architecture="test", hidden_size=32, vocab_size=64, layers=tuple(layers),
        attention=AttentionDims(num_heads=4, num_kv_heads=2, head_dim=8),
        mamba2=Mamba2Dims(num_heads=4, head_dim=8, d_state=4, n_groups=1, conv_kernel=4),
        dtype="bfloat16")


BLOCK, HEADS, HEAD = 4, 2, 8


def _kv_first(num_blocks: int, seed: int) -> torch.Tensor:
    """vLLM flash-attn logical shape [2, blocks, block_size, heads, head] (NHD memory)."""
    return _random((2, num_blocks, BLOCK, HEADS, HEAD), torch.bfloat16, seed)


def _blocks_first_hnd(num_blocks: int) -> torch.Tensor:
    """vLLM flashinfer logical shape [blocks, 2, block_size, heads, head] over HND memory
    (heads before block slots), as ``get_kv_cache_stride_order`` lays it out."""
    return torch.zeros((num_blocks, 2, HEADS, BLOCK, HEAD), dtype=torch.bfloat16).transpose(2, 3)


@pytest.mark.parametrize("n", [12, 10])  # whole blocks (direct), partial last block (staged)
def test_paged_kv_roundtrip_through_both_vllm_layouts(n: int) -> None:
    geo = _paged_geometry()
    lay = kv_layout(geo, n)
    src = [_kv_first(6, seed) for seed in (1, 2)]
    ids = [3, 0, 5]
    with dispatches() as seen:
        payload = gather_paged_kv(lay, src, ids, block_layout="flash_attn")
    assert seen.count("gather_kv_blocks") == 2
    parts = lay.unpack(payload)
    for j, layer in enumerate(geo.attention_layers):
        for kv, name in enumerate("kv"):  # token t is slot t % 4 of block ids[t // 4]
            want = torch.stack([src[j][kv, ids[t // BLOCK], t % BLOCK] for t in range(n)])
            assert torch.equal(parts[f"layers.{layer}.{name}"], want)

    dst = [_blocks_first_hnd(8) for _ in src]
    before = [d.clone() for d in dst]
    dst_ids = [7, 2, 4]
    scatter_paged_kv(lay, payload, dst, dst_ids, block_layout="flashinfer")
    back = gather_paged_kv(lay, dst, dst_ids, block_layout="blocks_first")
    assert torch.equal(_bits(back), _bits(payload))
    for d, b in zip(dst, before, strict=True):
        untouched = [i for i in range(8) if i not in dst_ids]
        assert torch.equal(d[untouched], b[untouched])
        assert torch.equal(d[dst_ids[-1], :, n % BLOCK or BLOCK:], b[dst_ids[-1], :, n % BLOCK or BLOCK:])
    # and back into the first layout at yet other blocks
    again = [_kv_first(6, 9) for _ in src]
    scatter_paged_kv(lay, back, again, [1, 4, 2], block_layout="kv_first")
    assert torch.equal(_bits(gather_paged_kv(lay, again, [1, 4, 2])), _bits(payload))


def test_paged_kv_errors() -> None:
    geo = _paged_geometry()
    lay = kv_layout(geo, 8)
    caches = [_kv_first(4, 0), _kv_first(4, 1)]
    with pytest.raises(ValueError, match="1 layer caches for a layout of 2 attention layers"):
        gather_paged_kv(lay, caches[:1], [0, 1])
    with pytest.raises(ValueError, match="8 tokens fill 2 blocks of 4, got 3 block ids"):
        gather_paged_kv(lay, caches, [0, 1, 2])
    wide = torch.zeros((2, 4, BLOCK, 4, HEAD), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="layers.3: cache holds 4 x 8 torch.bfloat16 per token"):
        gather_paged_kv(lay, [caches[0], wide], [0, 1])
    with pytest.raises(ValueError, match="repeated"):
        scatter_paged_kv(lay, gather_paged_kv(lay, caches, [0, 1]), caches, [2, 2])
    with pytest.raises(ValueError, match="ends inside part"):
        scatter_paged_kv(lay, torch.zeros(10, dtype=torch.bfloat16), caches, [0, 1])
    with pytest.raises(ValueError, match="needs a KV layout"):
        gather_paged_kv(state_layout(geo), caches, [0, 1])


@pytest.mark.parametrize("lo, hi", [(0, 12), (4, 12), (4, 10), (0, 3)])
def test_paged_kv_per_layer_tables_and_token_windows(lo: int, hi: int) -> None:
    """One block table per layer (engines with several KV cache groups) and a window of the
    payload's tokens (a load that starts inside a chunk): the window's tokens land at slot 0
    of each layer's own first block on, nothing else changes."""
    geo = _paged_geometry()
    lay = kv_layout(geo, 12)
    src = [_kv_first(6, seed) for seed in (1, 2)]
    tables = [[3, 0, 5], [1, 4, 2]]
    payload = gather_paged_kv(lay, src, tables)
    for j in range(2):  # a layer's own table: the same bytes as gathering that layer alone
        one = gather_paged_kv(kv_layout(geo, 12), [src[j]] * 2, tables[j])
        name = f"layers.{geo.attention_layers[j]}.k"
        assert torch.equal(lay.unpack(payload)[name], kv_layout(geo, 12).unpack(one)[
            f"layers.{geo.attention_layers[0]}.k"])
    dst = [_kv_first(8, 7 + j) for j in range(2)]
    before = [d.clone() for d in dst]
    n = hi - lo
    dst_tables = [[6, 1, 3][: -(-n // BLOCK)], [0, 7, 5][: -(-n // BLOCK)]]
    scatter_paged_kv(lay, payload, dst, dst_tables, tokens=(lo, hi))
    parts = lay.unpack(payload)
    for j, layer in enumerate(geo.attention_layers):
        want = before[j].clone()
        for kv, name in enumerate("kv"):
            for t in range(n):
                want[kv, dst_tables[j][t // BLOCK], t % BLOCK] = parts[f"layers.{layer}.{name}"][lo + t]
        assert torch.equal(_bits(dst[j]), _bits(want))
    with pytest.raises(ValueError, match=r"tokens \[4, 13\) are not inside the chunk's 12"):
        scatter_paged_kv(lay, payload, dst, dst_tables, tokens=(4, 13))
    with pytest.raises(ValueError, match="1 block tables for 2 layer caches"):
        gather_paged_kv(lay, src, tables[:1])


def test_payload_layout_does_not_depend_on_policies() -> None:
    """The anchor size rule is the geometry's (``geometry.anchors``): the payload layout
    packs to it without importing the policies package, directly or through another
    module."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("hybrid_connector")
    assert not graph.chain_exists(importer="hybrid_connector.payload",
                                  imported="hybrid_connector.policies", as_packages=True)
