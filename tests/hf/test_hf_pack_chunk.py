"""A restore moves a whole KV chunk in one kernel call (``hf_pack.scatter_kv_chunk``) into
cache tensors that are views of one allocation (``hf_pack.kv_buffers``), with the same
bytes as one call per part. On an H200 the per-part calls were bound by host work (~100
calls for an 8K-token hit, each ~200 us of host time against ~3 us of kernel)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hybrid_connector import kernels
from hybrid_connector.integrations.hf import pack as hf_pack


def _payload(parts: int, n: int, heads: int, dim: int, seed: int) -> list[torch.Tensor]:
    """A chunk's parts as ``PayloadLayout.unpack`` gives them: consecutive views of one
    payload."""
    g = torch.Generator().manual_seed(seed)
    flat = torch.randn(parts * n * heads * dim, generator=g)
    return [flat[j * n * heads * dim:(j + 1) * n * heads * dim].view(n, heads, dim)
            for j in range(parts)]


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = kernels.unpack_anchors

    def count(*a: Any, **k: Any) -> torch.Tensor:
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(kernels, "unpack_anchors", count)
    return calls


def test_a_whole_chunk_is_one_call_and_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    shapes = [(2, 8, torch.float32)] * 6  # K and V of three attention layers
    bufs, joint = hf_pack.kv_buffers(shapes, 40, torch.device("cpu"))
    assert joint is not None and all(b.data_ptr() == joint[j].data_ptr() for j, b in enumerate(bufs))
    ref = [torch.zeros(1, 2, 40, 8) for _ in shapes]
    calls = _counting(monkeypatch)
    for i, (s, e) in enumerate([(0, 16), (16, 32), (32, 48)]):
        parts = _payload(6, 16, 2, 8, seed=i)
        m = min(e, 40) - s
        hf_pack.scatter_kv_chunk(parts, bufs, joint, s, m)
        for part, r in zip(parts, ref, strict=True):
            r[0, :, s:s + m] = part[:m].transpose(0, 1)
    assert len(calls) == 1 + 1 + 6  # two whole chunks, then the cut one part by part
    for b, r in zip(bufs, ref, strict=True):
        assert torch.equal(b, r)


def test_parts_that_are_not_one_payload_go_part_by_part(monkeypatch: pytest.MonkeyPatch) -> None:
    shapes = [(2, 8, torch.float32)] * 2
    bufs, joint = hf_pack.kv_buffers(shapes, 16, torch.device("cpu"))
    parts = [t.clone() for t in _payload(2, 16, 2, 8, seed=3)]  # separate allocations
    calls = _counting(monkeypatch)
    hf_pack.scatter_kv_chunk(parts, bufs, joint, 0, 16)
    assert len(calls) == 2
    assert all(torch.equal(b[0], p.transpose(0, 1)) for b, p in zip(bufs, parts, strict=True))
    with pytest.raises(ValueError, match="do not fit"):
        hf_pack.scatter_kv_chunk(_payload(2, 16, 2, 8, seed=4), bufs, joint, 8, 16)


def test_unlike_parts_get_separate_buffers() -> None:
    bufs, joint = hf_pack.kv_buffers([(2, 8, torch.float32), (2, 4, torch.float32)], 10,
                                     torch.device("cpu"))
    assert joint is None and [tuple(b.shape) for b in bufs] == [(1, 2, 10, 8), (1, 2, 10, 4)]


@pytest.mark.parametrize("arch", ["qwen3_5", "jamba"])
def test_the_restored_cache_holds_the_restore_buffers_without_a_copy(arch: str) -> None:
    """``restore`` scatters into ``kv_buffers`` and hands those tensors to the cache
    (``hf_pack.adopt_kv``). Through ``DynamicLayer.update`` they were concatenated onto
    empty tensors: a second copy of every restored KV byte inside each hit's TTFT. The
    cache then continues bit for bit like the one it was extracted from."""
    from hf_support import restored_and_twin, tiny_model

    rt, toks, restored, twin, _ = restored_and_twin(tiny_model(arch), 24, 5)
    held = [(restored.layers[a.layer].keys, restored.layers[a.layer].values)
            for a in rt.adapter.attention]
    storages = {t.untyped_storage().data_ptr() for kv in held for t in kv}
    assert len(storages) == 1  # every K and V a view of the one ``kv_buffers`` allocation
    assert all(restored.layers[a.layer].get_seq_length() == 24 for a in rt.adapter.attention)
    assert torch.equal(rt.run_tokens(toks[24:], restored, 24), rt.run_tokens(toks[24:], twin, 24))
