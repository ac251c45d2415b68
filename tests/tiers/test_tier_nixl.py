"""The NIXL-backed NVMe tier: a real round trip where ``nixl`` imports, a clear error (and a
skip of the round trip) where it does not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tier_helpers import make_key, make_payload, same_bits

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.tiers.nixl import NixlNvmeTier, nixl_available

BUDGET = {k: 1 << 24 for k in ObjectKind}


def test_missing_nixl_is_a_clear_import_error(tmp_path: Path) -> None:
    if nixl_available():
        pytest.skip("nixl is installed")
    with pytest.raises(ImportError, match="nixl"):
        NixlNvmeTier(tmp_path, BUDGET)


@pytest.mark.skipif(not nixl_available(), reason="nixl is not installed")
def test_nixl_round_trip_and_restart(tmp_path: Path) -> None:  # pragma: no cover - needs nixl
    tier = NixlNvmeTier(tmp_path / "nixl", BUDGET)
    items = [(make_key(i), make_payload(i, (257,), dt))
             for i, dt in enumerate([torch.float32, torch.bfloat16, torch.int64])]
    assert all(tier.put(items))
    for k, v in items:
        assert same_bits(tier.get([k])[0], v)
    tier.close()
    again = NixlNvmeTier(tmp_path / "nixl", BUDGET)
    assert set(again.held_keys()) == {k for k, _ in items}
