from __future__ import annotations

import pytest

from hybrid_connector.core.config import HybridConfig, load_config
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.geometry.presets import get_preset


@pytest.fixture(scope="session")
def geo() -> ModelGeometry:
    return get_preset("marconi-7b")


@pytest.fixture(scope="session")
def sim_config() -> HybridConfig:
    return load_config(None, {"chunk_size": 256, "hash_block_size": 256, "alignment": 1}, environ={})
