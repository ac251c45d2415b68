"""One store interface: every store a caller can hold bytes in is an ``ObjectStore`` (whose
ledger half is the ``Backend`` an index stores through), and the composition root builds
the alpha tuners' caches without importing the policy simulator."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hybrid_connector import assemble
from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.backend import Backend
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.manager import TieredStore
from hybrid_connector.tiers.memory import MemoryStore
from hybrid_connector.tiers.size_only import Budget, SizeOnlyStore, zero_payload
from hybrid_connector.tiers.store import ObjectStore

KEY = ObjectKey("fp", b"\x01" * 16, ObjectKind.KV, 0, 4)


def test_the_interface_is_abstract() -> None:
    with pytest.raises(TypeError):
        ObjectStore([])  # type: ignore[abstract]


@pytest.mark.parametrize("make", [
    lambda: MemoryStore({k: 1 << 20 for k in ObjectKind}),
    lambda: TieredStore([HostTier({k: 1 << 20 for k in ObjectKind})], inline=True),
    lambda: SizeOnlyStore(Budget.per_kind({k: 1 << 20 for k in ObjectKind})),
], ids=["memory", "tiered", "size_only"])
def test_every_store_is_an_object_store_over_a_ledger_half(make) -> None:
    store = make()
    try:
        assert isinstance(store, ObjectStore) and isinstance(store, Backend)
        assert store.executor is not None  # the bytes are in this process
        payload = zero_payload(64) if isinstance(store, SizeOnlyStore) else torch.ones(16)
        assert store.put([(KEY, payload)]) == [True]
        assert store.where([KEY])[0] is not None
        got = store.get([KEY])[0]
        assert got is not None and got.numel() * got.element_size() == 64
    finally:
        store.close()


def test_assemble_store_is_an_object_store() -> None:
    store = assemble.store(HybridConfig(max_local_cpu_size="16MB"), device="cpu")
    try:
        assert isinstance(store, ObjectStore)
    finally:
        store.close()


def test_the_composition_root_does_not_import_the_simulator() -> None:
    code = ("import sys, hybrid_connector.assemble\n"
            "print(sorted(m for m in sys.modules if m.startswith('hybrid_connector.sim')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"VLLM_TARGET_DEVICE": "cpu"})
    assert out.stdout.strip() == "[]"
