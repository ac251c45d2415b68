"""Two engine processes (transformers runtime, tiny hybrid model) against one server
process: the second hits on what the first stored, and its restored states (every
recurrent layer's conv and SSM state, every attention layer's KV), logits and greedy
tokens equal a full prefill's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from server_peer_hf import server_mode
from server_support import ROOT, ServerProcess, server_config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hf"))
from hf_support import assert_exact_hit, random_tokens, tiny_model  # noqa: E402

from hybrid_connector.integrations.hf.runtime import HFRuntime  # noqa: E402
from hybrid_connector.remote.client.server_cache import ServerCache  # noqa: E402

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("arch", ["qwen3_5", "nemotron_h"])
def test_second_engine_process_hits_exactly_on_the_first_ones_prefix(arch: str, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    cfg = server_config(tmp_path, host_mb=1, disk_mb=64)  # a small host tier: NVMe serves too
    with ServerProcess(cfg, tmp_path) as srv:
        out = tmp_path / "peer.done"
        env = {**os.environ, "PYTHONPATH": f"{HERE}:{ROOT}"}
        env.pop("HYBRID_CONNECTOR_CONFIG", None)
        subprocess.run([sys.executable, str(HERE / "server_peer_hf.py"), arch, srv.url, str(out)],
                       check=True, timeout=300, env=env)
        assert out.read_text() == "done"
        model = tiny_model(arch)
        rt = HFRuntime.create(model, server_mode(srv.url))
        assert isinstance(rt.cache, ServerCache)
        stats = rt.cache.server_stats()
        assert stats is not None and stats["models"][rt.cache.fingerprint]["lookups"] == 2
        vocab = model.config.vocab_size
        probe = random_tokens(64, vocab, 31) + random_tokens(15, vocab, 34)
        assert_exact_hit(rt, model, probe, 64)  # also: the server's index checks itself
