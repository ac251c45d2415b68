"""The server runs each model's auto-alpha tuner bounded unless its config says otherwise: a
deterministic tuner would make a ``finish`` wait for its twin caches with the model's index
lock held (``hybrid_connector.server.models``, ``benchmarks/tuner_cost.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fault_support import GEO, save_conversation
from server_support import client_config, served, server_config

from hybrid_connector.remote.client.server_cache import ServerCache


def _tuner_after_eviction(extra: dict[str, Any]) -> Any:
    """Distinct conversations through a real server until its host tier evicts; the tuner
    the model's Marconi eviction then built (in the server's process)."""
    with served(server_config(host_mb=48, **extra)) as server:
        client = ServerCache(client_config(server.url), GEO)
        try:
            rng = np.random.default_rng(0)
            for _ in range(12):
                save_conversation(client, rng.integers(0, 30000, 1200))
            (cache,) = server.service.models.caches()
            assert sum(cache.stats.evicted.values()) > 0, "the budget must evict"
            return getattr(cache.eviction, "tuner", None), cache.config
        finally:
            client.close()


def test_a_served_model_runs_the_tuner_bounded_by_default() -> None:
    tuner, cfg = _tuner_after_eviction({})
    assert not cfg.shadow_deterministic and cfg.shadow_cpu_share == 0.2
    assert tuner is not None, "the first eviction builds the tuner"
    assert not tuner.deterministic and tuner.cpu_share == pytest.approx(0.2)


def test_the_servers_own_config_still_decides() -> None:
    tuner, cfg = _tuner_after_eviction({"shadow_deterministic": True})
    assert cfg.shadow_deterministic and tuner.deterministic


def test_the_shipped_server_config_runs_it_bounded() -> None:
    from pathlib import Path

    from hybrid_connector.core.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs/server.yaml", environ={})
    assert not cfg.shadow_deterministic and cfg.shadow_cpu_share == 0.2
