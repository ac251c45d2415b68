"""Stored bytes belong to the weights that computed them, through vLLM 0.33.0's own
Scheduler and a warm restart over one NVMe directory (``geometry.weights``).

A fine-tune has its base model's geometry, and vLLM's block hashes cover tokens, not
weights: an engine restarted on other weights of the same architecture (another directory,
files upgraded in place) or another configuration of them must not adopt what the tier
kept for the old ones. An engine
restarted on the same weights does, and so do engines that state the same ``model_id``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402
import vllm_support as s  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402


def _weights(model: Path, version: int) -> None:
    """A real safetensors file (vLLM reads its header at start-up), one per version."""
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.full((version,), float(version))}, str(model / "model.safetensors"))


def _prompts(tag: str) -> list[Any]:
    base = list(range(3, 123))
    return [h.make_request(f"{tag}{i}", base + [(7 * i + j) % 128 for j in range(40)], 2)
            for i in range(3)]


def _engine(model: Path, yaml: Path, requests: list[Any], model_id: str | None) -> Any:
    """One engine's life over ``model`` and the NVMe tier of ``yaml``: serve ``requests``,
    shut down; returns its scheduler side's counters."""
    vc = s.vllm_config(model, yaml, extra={"model_id": model_id} if model_id else None)
    cfg = s.kv_cache_config(vc, num_blocks=7)
    sched = h.make_scheduler(vc, cfg)
    runner = h.Runner(cfg, KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, cfg))
    h.run(sched, runner, requests)
    runner.connector.shutdown()
    sched.connector.shutdown()
    assert runner.bad == []
    return sched.connector.sched.stats


@pytest.mark.parametrize("case, adopted", [
    ("same weights", True),
    ("another directory", False),
    ("weights upgraded in place", False),
    ("configuration changed in place", False),
    ("another directory, same model_id", True),
    ("another directory, same model_id in the YAML", True),
])
def test_a_restart_adopts_only_what_its_own_weights_stored(tmp_path: Path, case: str,
                                                           adopted: bool) -> None:
    yaml = tmp_path / "nvme.yaml"
    stated = "extra_config: {model_id: org/tiny-ft@0123abc}\n" if "YAML" in case else ""
    yaml.write_text(s.BASE_YAML.split("pools:")[0] + s.DISK_YAML.format(dir=tmp_path / "nvme") + stated)
    model = s.tiny_nemotron_h(tmp_path)
    _weights(model, 1)
    model_id = "org/tiny-ft@0123abc" if "model_id" in case and not stated else None
    first = _engine(model, yaml, _prompts("a"), model_id)
    assert first.saved_objects["state"] > 0
    if "directory" in case:
        model = Path(shutil.copytree(model, tmp_path / "fine_tune"))
    elif "upgraded" in case:
        _weights(model, 2)
    elif "configuration" in case:  # same weights, another norm epsilon: other KV
        cfg = json.loads((model / "config.json").read_text())
        cfg["layer_norm_epsilon"] *= 10
        (model / "config.json").write_text(json.dumps(cfg))
    warm = h.make_request("warm", list(range(40)), 2)  # its first step carries the inventory
    st = _engine(model, yaml, [warm, *_prompts("b")], model_id)
    if adopted:
        assert st.restored.get("state", 0) > 0 and st.hits >= 2
    else:
        assert not any(st.restored.values()) and st.hits == 0


def test_weights_id_names_the_directory_revision_and_files(tmp_path: Path) -> None:
    from hybrid_connector.geometry.weights import weights_id

    (tmp_path / "model.safetensors").write_bytes(b"1")
    (tmp_path / "tokenizer.json").write_text("{}")
    a = weights_id(str(tmp_path))
    assert a.startswith(f"{tmp_path.resolve()}@#") and a == weights_id(str(tmp_path))
    assert weights_id(str(tmp_path), "v2") != a
    (tmp_path / "tokenizer.json").write_text('{"changed": 1}')  # not weights
    assert weights_id(str(tmp_path)) == a
    (tmp_path / "model.safetensors").write_bytes(b"22")
    assert weights_id(str(tmp_path)) != a
    assert weights_id("org/not-downloaded", "main") == "org/not-downloaded@main"
    assert weights_id("") == ""


def test_config_digest_ignores_only_private_fields() -> None:
    from hybrid_connector.geometry.weights import config_digest

    base = {"rope_theta": 1e6, "transformers_version": "4.57", "_name_or_path": "/a"}
    same = {**base, "transformers_version": "5.0", "_name_or_path": "/b"}
    assert config_digest(base) == config_digest(same) != config_digest({**base, "rope_theta": 2e6})
    assert config_digest(None) == ""


def test_a_hub_id_is_read_from_its_local_snapshot(tmp_path: Path) -> None:
    """A hub id names its downloaded snapshot: the commit "main" points at and the files;
    a new commit on "main" changes it."""
    from hybrid_connector.geometry.weights import weights_id

    repo = tmp_path / "models--org--tiny"
    for sha in ("a" * 40, "b" * 40):
        (repo / "snapshots" / sha).mkdir(parents=True)
        (repo / "snapshots" / sha / "model.safetensors").write_bytes(sha[:1].encode())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    first = weights_id("org/tiny", None, str(tmp_path))
    assert first.startswith("org/tiny@" + "a" * 40 + "#")
    (repo / "refs" / "main").write_text("b" * 40)
    assert weights_id("org/tiny", None, str(tmp_path)).startswith("org/tiny@" + "b" * 40)
    assert weights_id("org/tiny", "a" * 40, str(tmp_path)) == first
