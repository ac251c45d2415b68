"""Exactness through SGLang's host-pool layouts (SGLang #39830 reports wrong output on
host-tier hits with GDN models): a tiny transformers Qwen3.5 (GDN + attention) prefills
part of a prompt; its real KV and GDN states are written into a KV host pool and SGLang's
own ``MambaPoolHost``, both in SGLang's ``page_first`` layouts, stored through our backend, loaded back into
other host slots on a later request's hit, restored into a fresh transformers cache and
resumed. The resumed logits equal resuming from the model's own cache bit for bit, and a
full prefill within float tolerance; the restored tensors equal a full prefill's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hf"))

import torch  # noqa: E402
from hf_support import (  # noqa: E402
    _one_thread,  # noqa: F401 - autouse: one torch thread for tiny models
    assert_restored_exact,
    random_tokens,
    runtime,
    tiny_model,
)
from host_pools import KVHostPool, sglang_mamba_pool  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import count_pool_hits  # noqa: E402
from sglang_helpers import (  # noqa: E402
    dynamic_backend,
    page_hashes,
    register,
    state_transfer,
    tier_overrides,
)
from sglang_helpers import kv_transfer as _kv_transfer  # noqa: E402

from hybrid_connector.integrations.hf.state import new_model_cache  # noqa: E402
from hybrid_connector.payload.layout import kv_layout  # noqa: E402

PAGE = 4  # sglang_helpers' page size: its hashes and KV transfers use it
N, P = 40, 24  # prompt tokens, tokens of the first request (6 pages)
TOL = 1e-5


@pytest.mark.parametrize("tier", ["host", "nvme"])
def test_qwen3_5_resumes_exactly_from_pages_and_a_state_stored_through_sglang_layouts(
        tier: str, tmp_path: Path) -> None:
    model = tiny_model("qwen3_5")
    rt = runtime(model)
    ad = rt.adapter
    toks = torch.tensor(random_tokens(N, model.config.vocab_size, 11))
    mc = new_model_cache(model)
    rt.run_tokens(toks[:P], mc, 0)

    # The first request's KV and state, in SGLang's page_first host layouts.
    kv_parts = kv_layout(ad.geometry, P).unpack(ad.extract_kv(mc, 0, P))
    states = ad.unpack_state(ad.extract_state(mc))
    att = [a.layer for a in ad.attention]
    a0 = ad.attention[0]
    kv_pool = KVHostPool(16 * PAGE, PAGE, len(att), a0.kv_heads, a0.head_dim, torch.float32)
    kv_pool.kv_buffer.zero_()
    (conv0, rec0) = next(iter(states.values()))
    assert rec0 is not None
    mamba = sglang_mamba_pool(4, len(states), tuple(rec0.shape), [tuple(conv0.shape)],
                              temporal_dtype=rec0.dtype, conv_dtype=conv0.dtype, seed=None)
    for j, layer in enumerate(att):
        kv_pool.kv_buffer[0, :P, j] = kv_parts[f"layers.{layer}.k"]
        kv_pool.kv_buffer[1, :P, j] = kv_parts[f"layers.{layer}.v"]
    for j, (conv, rec) in enumerate(states.values()):
        mamba.conv_buffer[0][1, j, 0] = conv
        mamba.temporal_buffer[1, j, 0] = rec

    backend = dynamic_backend(tier_overrides(tier, tmp_path, lambda: ""))
    register(backend, kv_pool, mamba)
    first = page_hashes(toks[:P].tolist())
    saved = backend.batch_set_v2([state_transfer(first[-1], 1), _kv_transfer(first, 0)])
    assert count_pool_hits(saved) == {"kv": P // PAGE, "mamba": 1}

    # A later request with the whole prompt: SGLang asks, then loads into other slots.
    later = page_hashes(toks.tolist())
    hit = backend.batch_exists_v2(later, [state_transfer(later[-1], None)])
    assert hit.kv_hit_pages == P // PAGE and hit.restorable_prefix_pages == [P // PAGE]
    got = backend.batch_get_v2([_kv_transfer(later[: P // PAGE], 8), state_transfer(later[P // PAGE - 1], 3)])
    assert count_pool_hits(got) == {"kv": P // PAGE, "mamba": 1}

    # Host pool slots -> a fresh transformers cache.
    loaded = {f"layers.{layer}.{kv}": kv_pool.kv_buffer[i, 8 * PAGE : 8 * PAGE + P, j]
              for j, layer in enumerate(att) for i, kv in enumerate("kv")}
    kv_payload = kv_layout(ad.geometry, P).pack({n: loaded[n] for n in kv_layout(ad.geometry, P).names})
    parts = {}
    for j, s in enumerate(ad.recurrent):
        parts[s.conv_part] = mamba.conv_buffer[0][3, j, 0]
        parts[s.rec_part] = mamba.temporal_buffer[3, j, 0]
    state = ad.state_layout.pack({n: parts[n] for n in ad.state_layout.names})
    restored = ad.restore([kv_payload], [(0, P)], P, state)
    assert_restored_exact(ad, model, toks.tolist(), restored, P, rtol=0.0)

    resumed = rt.run_tokens(toks[P:], restored, P)
    own = rt.run_tokens(toks[P:], mc, P)  # the model's own cache, never stored
    full = rt.run_tokens(toks, new_model_cache(model), 0)
    assert torch.equal(resumed, own)
    assert (resumed - full[P:]).abs().max().item() <= TOL
    backend.close()
    rt.close()
