"""Cross-instance hits with real model compute: a transformers runtime in another process
fills the shared remote store; a fresh runtime here finds its objects, hits on the shared
prefix, and its restored states and logits equal a full prefill's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hf"))

from cross_peer_hf import hf_config  # noqa: E402
from hf_support import (  # noqa: E402
    assert_exact_hit,
    random_tokens,
    runtime,
    tiny_model,
)

from hybrid_connector import assemble  # noqa: E402

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("server", ["redis_server", "lmcache_server"])
def test_a_fresh_runtime_hits_on_another_process_prefix_exactly(server, request, tmp_path) -> None:
    url = request.getfixturevalue(server)
    arch = "qwen3_5"
    out = tmp_path / "peer.done"
    subprocess.run([sys.executable, str(HERE / "cross_peer_hf.py"), arch, url, str(out)],
                   check=True, timeout=300,
                   env={"PYTHONPATH": f"{HERE}:{HERE.parent.parent}", "PATH": "/usr/bin:/bin"})
    assert out.read_text() == "done"
    model = tiny_model(arch)
    rt = runtime(model, conf=hf_config(url), store=assemble.store(hf_config(url)))
    assert not rt.cache.index.where                      # knows nothing of its own
    probe = random_tokens(64, model.config.vocab_size, 31) + random_tokens(15, model.config.vocab_size, 34)
    assert_exact_hit(rt, model, probe, 64)
