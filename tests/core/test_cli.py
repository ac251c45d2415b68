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


# ---------------------------------------------------------------- issue 9, item 21
def test_every_registered_command_exists():
    import importlib

    from hybrid_connector import cli

    for module, hook in cli.COMMANDS:
        assert callable(getattr(importlib.import_module(module), hook)), (module, hook)
    names = set(cli.build_parser()._subparsers._group_actions[0].choices)
    assert {"demo", "inspect", "simulate", "gen-trace"} <= names


@pytest.mark.parametrize("entry, needles", [
    (("hybrid_connector.no_such_command", "add_parser"), ("hybrid_connector.no_such_command",)),
    (("hc_test_broken_cmd", "add_parser"), ("hc_test_broken_cmd", "hc_test_missing_dependency")),
    (("hybrid_connector.demo", "no_such_hook"), ("hybrid_connector.demo", "no_such_hook")),
])
def test_a_registered_command_that_fails_to_load_is_a_clear_error(
        tmp_path, monkeypatch, capsys, entry, needles):
    from hybrid_connector import cli

    (tmp_path / "hc_test_broken_cmd.py").write_text("import hc_test_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, entry))
    assert main(["demo", "--sessions", "1"]) == 1
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err
