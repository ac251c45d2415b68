import re
from pathlib import Path

import pytest

from hybrid_connector.cli import main
from hybrid_connector.config import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_validate(path):
    load_config(path, environ={})


def test_demo_runs_and_hits(capsys):
    assert main(["demo", "--sessions", "3", "--turns", "3", "--host-size", "512MiB"]) == 0
    out = capsys.readouterr().out
    assert "integrity check passed" in out
    rate = float(re.search(r"token hit rate\s+([0-9.]+)%", out).group(1))
    assert rate > 20.0  # later turns reuse the previous turn's final checkpoint


def test_inspect_reports_sizes_and_vllm_block(capsys):
    from hybrid_connector.inspect_cmd import vllm_align_block
    from hybrid_connector.model_presets import get_preset

    assert vllm_align_block(get_preset("qwen3.5-4b")) == 528    # vLLM #40696
    assert vllm_align_block(get_preset("qwen3.5-0.8b")) == 544
    assert main(["inspect", "--config", str(ROOT / "configs" / "vllm.yaml"), "--model", "qwen3.5-4b"]) == 0
    out = capsys.readouterr().out
    assert "49.12 MiB" in out and "528 tokens" in out and "host" in out and "disk" in out
