"""What SGLang hands the backend is checked before anything moves, driven as SGLang calls
it, on SGLang's own MAMBA host pool and the KV pool of ``host_pools``:

* only pages of a host pool's page size are stored: the legacy ``set`` of a 7-byte tensor
  is refused (it was stored and then counted by ``exists`` and failed by every load), and a
  held object of another size is replaced by the next v2 set (it was kept as "held");
* host indices outside the pool (negative ones read Python-style from its end), past its
  end, not consecutive within a page or not integers refuse the whole transfer: nothing is
  stored, nothing is written into the pool (they were stored and loaded at wrong slots).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang")

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer  # noqa: E402
from sglang_helpers import (  # noqa: E402
    PAGE,
    dynamic_backend,
    kv_bytes,
    kv_transfer,
    page_hashes,
    pools,
    register,
    slot_bytes,
    state_transfer,
    tier_overrides,
)

from hybrid_connector.core.keys import ObjectKind  # noqa: E402
from hybrid_connector.integrations.sglang import HybridHiCacheStorage  # noqa: E402


def _backend(tier: str, tmp_path: Path) -> tuple[HybridHiCacheStorage, Any, Any]:
    backend = dynamic_backend(tier_overrides(tier, tmp_path, lambda: ""))
    assert isinstance(backend, HybridHiCacheStorage)
    kv, mamba = pools()
    register(backend, kv, mamba)
    return backend, kv, mamba


@pytest.mark.parametrize("tier", ["host", "nvme"])
def test_a_wrongly_sized_page_is_refused_and_a_held_one_replaced(tier: str,
                                                                 tmp_path: Path) -> None:
    backend, kv, mamba = _backend(tier, tmp_path)
    hashes = page_hashes(list(range(3 * PAGE)))
    seven = torch.arange(7, dtype=torch.uint8)
    # the legacy calls: a 7-byte tensor (or a page and a byte more) is no page: refused
    assert backend.set(hashes[0], seven) is False
    assert backend.set(hashes[0], torch.zeros(kv.get_dummy_flat_data_page().numel() + 1,
                                              dtype=kv.dtype)) is False
    assert backend.batch_set(hashes[:2], [seven, seven]) is False
    assert not backend.exists(hashes[0]) and backend.batch_exists_v2(hashes).kv_hit_pages == 0
    assert backend.store.keys(ObjectKind.KV) == []
    # objects of another size held under the page hashes (older builds, other writers)
    keys = backend.keys
    assert all(backend.store.put([(keys.key("kv", h), seven)]) for h in hashes[:2])
    assert backend.store.put([(keys.key("mamba", hashes[-1]), seven)]) == [True]
    # the v2 set replaces them; then exists and get agree, bit for bit
    assert backend.batch_set_v2([kv_transfer(hashes, 0), state_transfer(hashes[-1], 0)]) \
        == {"kv": [True] * 3, "mamba": [True]}
    assert backend.batch_exists_v2(hashes, [state_transfer(hashes[-1], None)]).kv_hit_pages == 3
    assert backend.batch_get_v2([kv_transfer(hashes, 10), state_transfer(hashes[-1], 5)]) \
        == {"kv": [True] * 3, "mamba": [True]}
    assert kv_bytes(kv, 10, 3) == kv_bytes(kv, 0, 3) and slot_bytes(mamba, 5) == slot_bytes(mamba, 0)
    # a legacy set of a page's bytes in another dtype is stored as the pool's page
    page = kv.get_data_page(20 * PAGE)
    assert backend.set(hashes[0], page.view(torch.uint8).reshape(8, -1)) is True
    assert backend.batch_get_v1(hashes[:1], torch.arange(21 * PAGE, 22 * PAGE)) == [True]
    assert kv_bytes(kv, 21, 1) == kv_bytes(kv, 20, 1)
    backend.close()


def _kv(hashes: list[str], idx: torch.Tensor) -> PoolTransfer:
    return PoolTransfer(name=PoolName.KV, host_indices=idx, keys=list(hashes))


def _bad_kv_indices(size: int) -> dict[str, torch.Tensor]:
    """Three pages' worth of host indices a KV pool of ``size`` slots must refuse."""
    return {
        "negative": torch.arange(-3 * PAGE, 0),  # read from the pool's end, Python-style
        "past-end": torch.arange(size, size + 3 * PAGE),
        "straddling": torch.arange(size - 2 * PAGE - 1, size + PAGE - 1),  # last page cut short
        "one-negative": torch.cat([torch.arange(0, 3 * PAGE - 1), torch.tensor([-1])]),
        "not-consecutive": torch.tensor([0, 1, 2, 3, 4, 6, 5, 7, 8, 9, 10, 11]),
        "float": torch.arange(0, 3 * PAGE, dtype=torch.float32),
    }


@pytest.mark.parametrize("bad", list(_bad_kv_indices(128)))
def test_bad_host_indices_refuse_the_transfer_and_nothing_moves(bad: str, tmp_path: Path) -> None:
    backend, kv, mamba = _backend("host", tmp_path)
    assert kv.size == 128
    idx = _bad_kv_indices(kv.size)[bad]
    hashes = page_hashes(list(range(3 * PAGE)))
    # sets (v2, v1): refused, nothing stored
    assert backend.batch_set_v2([_kv(hashes, idx)]) == {"kv": [False] * 3}
    assert backend.batch_set_v1(hashes, idx) == [False] * 3
    assert backend.store.keys(ObjectKind.KV) == []
    assert backend.batch_exists_v2(hashes).kv_hit_pages == 0
    # loads of stored pages: refused, the pool untouched
    assert backend.batch_set_v2([kv_transfer(hashes, 0)]) == {"kv": [True] * 3}
    before = kv.kv_buffer.clone()
    assert backend.batch_get_v2([_kv(hashes, idx)]) == {"kv": [False] * 3}
    assert backend.batch_get_v1(hashes, idx) == [False] * 3
    assert torch.equal(kv.kv_buffer, before)
    backend.close()


def test_bad_state_slots_refuse_the_transfer_and_nothing_moves(tmp_path: Path) -> None:
    backend, kv, mamba = _backend("host", tmp_path)
    hashes = page_hashes(list(range(PAGE)))
    for slot in (-1, -mamba.size, mamba.size):
        assert backend.batch_set_v2([state_transfer(hashes[0], slot)]) == {"mamba": [False]}
        assert backend.store.keys(ObjectKind.STATE) == []
    assert backend.batch_set_v2([state_transfer(hashes[0], 0)]) == {"mamba": [True]}
    before = [slot_bytes(mamba, s) for s in range(mamba.size)]
    for slot in (-1, mamba.size):
        assert backend.batch_get_v2([state_transfer(hashes[0], slot)]) == {"mamba": [False]}
    assert [slot_bytes(mamba, s) for s in range(mamba.size)] == before
    backend.close()
