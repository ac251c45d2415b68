"""Two cache instances in two processes, each with its own host tier, sharing one real
3-master, 3-replica Redis Cluster (``redis+cluster://``): the second finds the first's
objects through the cluster's manifests and keys and hits on its prefixes, loading exactly
the bytes the first made, and a third process hits on what the second saved; with the transformers runtime, its restored KV and recurrent
states, logits and greedy tokens equal a full prefill's. The same peers as
``test_cross_instance*.py`` use against one ``redis-server``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cluster_servers import Cluster
from cross_peer import GEO, config, prompts, serve

from hybrid_connector import assemble

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "hf"))


def _peer(script: str, *args: str, timeout: float) -> None:
    subprocess.run([sys.executable, str(HERE / script), *args], check=True, timeout=timeout,
                   env={"PYTHONPATH": f"{HERE}:{HERE.parent.parent}", "PATH": "/usr/bin:/bin",
                        "OMP_NUM_THREADS": "1"})


@pytest.mark.server
def test_second_instance_hits_on_the_first_ones_prefixes_across_shards(
        redis_cluster: Cluster, tmp_path: Path) -> None:
    url = redis_cluster.url
    _peer("cross_peer.py", url, str(tmp_path / "peer.done"), timeout=120)
    assert (tmp_path / "peer.done").read_text() == "done"
    cache = assemble.cache(config(url), GEO)      # a fresh index: knows nothing yet
    assert not cache.index.where
    first, second = prompts()
    hit = serve(cache, np.r_[first, [1, 2, 3]])   # checked byte for byte inside
    assert hit >= 40 and cache.stats.hits == 1
    plan = cache.lookup(np.r_[first, [1, 2, 3]])
    assert {o.tier for o in plan.objects} <= {"host", "remote"}
    assert serve(cache, np.r_[second, [5]]) > 0
    # and the other way: what this instance saved, a fresh process hits on
    mine = prompts(seed=11)[0]
    assert serve(cache, mine) == 0
    cache.flush()
    cache.check_integrity()
    cache.close()
    probe = ",".join(str(int(t)) for t in np.r_[mine, [1, 2]])
    _peer("cross_peer_read.py", url, str(tmp_path / "hit"), probe, timeout=120)
    assert int((tmp_path / "hit").read_text()) >= 40


@pytest.mark.server
def test_a_fresh_runtime_hits_exactly_on_another_process_prefix_via_the_cluster(
        redis_cluster: Cluster, tmp_path: Path) -> None:
    from cross_peer_hf import hf_config
    from hf_support import assert_exact_hit, random_tokens, runtime, tiny_model

    url, arch = redis_cluster.url, "qwen3_5"
    _peer("cross_peer_hf.py", arch, url, str(tmp_path / "peer.done"), timeout=300)
    assert (tmp_path / "peer.done").read_text() == "done"
    model = tiny_model(arch)
    rt = runtime(model, conf=hf_config(url), store=assemble.store(hf_config(url)))
    assert not rt.cache.index.where                      # knows nothing of its own
    vocab = model.config.vocab_size
    probe = random_tokens(64, vocab, 31) + random_tokens(15, vocab, 34)
    assert_exact_hit(rt, model, probe, 64)  # restored states, logits and tokens exact
