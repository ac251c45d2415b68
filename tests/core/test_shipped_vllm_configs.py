"""The shipped vLLM configs start on the model they name: the connector refuses a
``chunk_size`` that is not a multiple of vLLM's block (``integrations.vllm.setup``), and
vLLM 0.33 aligns a hybrid model's block to its state page (``cache_figures``, checked
against vLLM in ``test_geometry_scaled``). Nemotron-H 8B's block is 1,040 tokens: the
``chunk_size: 2048`` shipped before made ``vllm serve`` fail at start-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybrid_connector.bench.vllm_peers.setups import SHIPPED, shipped_chunk_blocks
from hybrid_connector.core.config import load_config
from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.geometry.scaled import cache_figures

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("preset", sorted(SHIPPED))
def test_the_shipped_chunk_is_one_vllm_block(preset: str) -> None:
    cfg = load_config(CONFIGS / SHIPPED[preset], environ={})
    block = cache_figures(get_preset(preset)).block_size
    assert cfg.chunk_size % block == 0, (preset, cfg.chunk_size, block)
    assert block % cfg.hash_block_size == 0 and block % cfg.alignment == 0
    # one block: the grain vLLM hits at (docs/vllm_peers.md: chat, QA and Mooncake gain)
    assert shipped_chunk_blocks(preset, cfg.chunk_size) == 1


def test_a_chunk_off_the_block_grid_is_named() -> None:
    with pytest.raises(ValueError, match="not a multiple of vLLM's block size 1040"):
        shipped_chunk_blocks("nemotron-h-8b", 2048)


@pytest.mark.parametrize("name", ["vllm.yaml", "vllm-qwen3_5.yaml", "vllm-nemotron_h.yaml"])
def test_the_shipped_tuner_never_holds_vllms_engine_loop(name: str) -> None:
    """The auto-alpha tuner's twin caches step on a thread of vLLM's engine-core process.
    Deterministic, the engine thread waited for them every ``check_every`` requests, and
    their steps held the interpreter lock unbounded: with the host evicting, a step of the
    scheduler took 10x OffloadingConnector's wall time (31 ms against 3.1 ms mean, 136 ms
    p99; ``benchmarks/vllm_scheduler_cost.py --wall --host-mb 4``). Shipped: it skips what
    it cannot keep up with and takes at most a fifth of the wall time."""
    cfg = load_config(CONFIGS / name, environ={})
    assert cfg.alpha == "auto" and cfg.alpha_tuner == "shadow"
    assert not cfg.shadow_deterministic
    assert cfg.shadow_cpu_share <= 0.2


@pytest.mark.parametrize("name", ["ours-pooled", "ours-shipped"])
def test_the_head_to_head_runs_the_tuner_deterministic_unless_asked_as_shipped(
        name: str, tmp_path: Path) -> None:
    """``ours*`` peers repeat run to run (deterministic tuner); ``ours-shipped`` is
    ``ours-pooled`` with the tuner exactly as the shipped config runs it."""
    from hybrid_connector.bench.vllm_peers.setups import peer

    p = peer(name, 1 << 20, preset="qwen3.5-4b", block=32, work=tmp_path, configs=CONFIGS)
    assert p.transfer is not None
    cfg = load_config(p.transfer["kv_connector_extra_config"]["config_file"], environ={})
    shipped = load_config(CONFIGS / SHIPPED["qwen3.5-4b"], environ={})
    assert cfg.pools.host is not None and cfg.pools.host.kv_state == 1 << 20
    if name == "ours-shipped":
        assert (cfg.shadow_deterministic, cfg.shadow_cpu_share) == (
            shipped.shadow_deterministic, shipped.shadow_cpu_share)
    else:
        assert cfg.shadow_deterministic


def test_a_config_that_says_nothing_gets_the_bounded_tuner() -> None:
    """A vLLM user without a config file, the cache server without one, the transformers
    runtime: the defaults are what runs. Deterministic by default, a ``finish`` waited for
    the twin caches with the index lock held (``benchmarks/tuner_cost.py``: 160 ms p99)."""
    from hybrid_connector import assemble
    from hybrid_connector.policies.tuning.shadow import ShadowTuner

    cfg = load_config(None, {}, environ={})
    assert cfg.alpha == "auto" and cfg.eviction == "marconi" and cfg.alpha_tuner == "shadow"
    assert not cfg.shadow_deterministic and cfg.shadow_cpu_share == 0.2
    pol = assemble.policies(cfg).eviction
    factory = pol._tuner_factory  # type: ignore[attr-defined]
    tuner = factory(get_preset("qwen3.5-0.8b"), {})
    try:
        assert isinstance(tuner, ShadowTuner)
        assert not tuner.deterministic and tuner.cpu_share == 0.2
    finally:
        tuner.close()
