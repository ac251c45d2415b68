import re
from pathlib import Path

import pytest
import yaml

from hybrid_connector.cli import main
from hybrid_connector.core.config import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_validate(path):
    if "capacity" in (yaml.safe_load(path.read_text()) or {}):
        from hybrid_connector.bench.schema import load_capacity_config  # the bench's own schema

        load_capacity_config(path)
        return
    load_config(path, environ={})


def _field(out, name, pattern=r"(\S.*)"):
    return re.search(rf"^{name}\s+{pattern}", out, re.M).groups()


def _kinds(text):
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", text)}


def test_demo_report_matches_the_cache_and_the_trace(capsys, monkeypatch):
    """What the demo prints is what the cache counted and what the store holds, and the
    hits are what the trace guarantees: each later turn's prompt extends the previous
    turn's prompt + output, so it hits at least that conversation (alignment 16)."""
    from hybrid_connector.cli import demo
    from hybrid_connector.core.keys import ObjectKind
    from hybrid_connector.sim.traces import multi_turn_chat

    caches = []
    real = demo.run_demo
    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: caches.append(real(*a, **k)) or caches[-1])
    assert main(["demo", "--sessions", "3", "--turns", "3", "--host-size", "1GiB"]) == 0
    out = capsys.readouterr().out
    (cache,) = caches
    st = cache.stats
    records = multi_turn_chat(3, 3, 0)
    assert int(_field(out, "requests", r"(\d+)")[0]) == st.lookups == len(records) == 9
    hit, prompt = map(int, _field(out, "token hit rate", r"[0-9.]+%\s+\((\d+) of (\d+) prompt")[:2])
    assert (hit, prompt) == (st.hit_tokens, st.prompt_tokens)
    assert prompt == sum(len(r["input_tokens"]) for r in records)
    rate = float(_field(out, "token hit rate", r"([0-9.]+)%")[0])
    assert rate == pytest.approx(100 * hit / prompt, abs=0.05)
    assert float(_field(out, "request hit rate", r"([0-9.]+)%")[0]) == pytest.approx(
        100 * st.hits / st.lookups, abs=0.05)
    assert _kinds(_field(out, "stored objects")[0]) == {k: float(v) for k, v in st.stored.items()}
    resident = _kinds(_field(out, "resident MiB")[0])
    for kind in ObjectKind:  # the index and the store agree on what is held
        assert resident[kind.value] == pytest.approx(cache.store.used(kind) / 2**20, abs=0.05)
    prev, floor = {}, 0
    for r in records:
        if r["session_id"] in prev:
            floor += len(prev[r["session_id"]]) // 16 * 16
        prev[r["session_id"]] = r["input_tokens"] + r["output_tokens"]
    assert st.evicted == {k.value: 0 for k in ObjectKind}  # the pools are large enough
    assert floor > 0 and hit >= floor


def test_demo_fails_on_a_corrupt_load(capsys, monkeypatch):
    import hybrid_connector.tiers.manager

    real = hybrid_connector.tiers.manager.build_store

    def corrupting_store(cfg, device=None):
        store = real(cfg, device)
        read = store.executor.read

        def flip_first_byte(keys, hints=None):
            out = [None if t is None else t.clone() for t in read(keys, hints)]
            if out and out[0] is not None:
                out[0][0] ^= 1
            return out

        store.executor.read = flip_first_byte  # what every load reads through
        return store

    monkeypatch.setattr(hybrid_connector.tiers.manager, "build_store", corrupting_store)
    assert main(["demo", "--sessions", "2", "--turns", "2", "--host-size", "512MiB"]) == 1
    captured = capsys.readouterr()
    assert "corrupt KV chunk" in captured.err and "verified" not in captured.out


@pytest.mark.parametrize("argv, code, needle", [
    (["demo", "--sessions", "x"], 2, "--sessions"),
    (["demo", "--turns", "0"], 2, "--turns"),
    (["demo", "--host-size", "lots"], 2, "max_local_cpu_size"),
    (["demo", "--model", "no-such-model"], 2, "no-such-model"),
    (["demo", "--config", "/nonexistent/c.yaml"], 2, "/nonexistent/c.yaml"),
    (["no-such-command"], 2, "no-such-command"),
])
def test_bad_arguments_exit_2_with_a_message_naming_them(capsys, argv, code, needle):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    assert rc == code
    assert needle in capsys.readouterr().err


def test_inspect_reports_sizes_and_vllm_block(capsys):
    from hybrid_connector.cli.inspect_cmd import vllm_align_block
    from hybrid_connector.geometry.presets import get_preset

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
    (("hybrid_connector.cli.demo", "no_such_hook"), ("hybrid_connector.cli.demo", "no_such_hook")),
])
def test_a_registered_command_that_fails_to_load_is_a_clear_error(
        tmp_path, monkeypatch, capsys, entry, needles):
    from hybrid_connector.cli import entry as cli

    (tmp_path / "hc_test_broken_cmd.py").write_text("import hc_test_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, entry))
    assert main(["demo", "--sessions", "1"]) == 1
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err
