"""The connector on the buffers vLLM 0.33.0 itself hands ``register_kv_caches``
(``allocate_kv_cache``'s per-layer ``[B, H, N, C]`` views of one int8 allocation that
every group aliases; see ``buffers``), for every attention backend vLLM can pick for
a supported hybrid and every layout vLLM resolves for it: registration, a save that reads
exactly the KV and state the backend and the Mamba layer read, and a load that writes them
exactly and nothing else (every other byte of the shared allocation bit-identical)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
import vllm_buffers as vb  # noqa: E402
import vllm_support as s  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.kv_cache_interface import MambaSpec  # noqa: E402
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

from hybrid_connector.integrations.vllm.setup import HybridStartupError, layer_index  # noqa: E402
from hybrid_connector.payload.layout import kv_layout  # noqa: E402

YAML = "chunk_size: 64\nhash_block_size: 32\nalignment: 32\npools:\n  host: {kv: 4MB, state: 2MB}\nreplay: false\n"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("vllm_buffers")
    (root / "hybrid.yaml").write_text(YAML)
    return root


@pytest.fixture(scope="module")
def model(root: Any) -> tuple[Any, Any]:
    return s.tiny_nemotron_h(root), root / "hybrid.yaml"


def setup(model: tuple[Any, Any], backend: str, layout: str,
          kernel_block: int | None = None) -> dict[str, Any]:
    """vLLM's config, its KV cache config and its own buffers for ``backend``/``layout``
    (skips what this CPU install cannot describe, and layouts vLLM does not resolve);
    ``kernel_block``: the attention kernel block size, where a backend splits blocks."""
    try:
        cls = vb.backend_class(backend)
    except (ImportError, AssertionError) as e:
        pytest.skip(f"vLLM's CPU install cannot import {backend}: {e}")
    vc = s.vllm_config(*model, layout=layout)
    if layout not in vb.hybrid_layouts(vc, cls, s.layer_specs(vc)):
        pytest.skip(f"vLLM does not resolve {layout} for a hybrid model on {backend}")
    cfg = s.kv_cache_config(vc, num_blocks=7)
    bufs = vb.allocate(cfg, layout, cls, seed=3, kernel_block=kernel_block)
    vb.bind_backend(vc, cfg, cls)
    specs = {n: g.kv_cache_spec for g in cfg.kv_cache_groups for n in g.layer_names}
    return {"vc": vc, "cfg": cfg, "bufs": bufs, "specs": specs, "backend": backend}


def twin(bufs: dict[str, torch.Tensor], raw: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same views (sizes, strides, offsets, dtypes) over another backing allocation."""
    out = {}
    for n, t in bufs.items():
        base = raw.view(t.dtype) if t.dtype != torch.int8 else raw
        out[n] = torch.as_strided(base, t.size(), t.stride(), t.storage_offset())
    return out


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical (random bytes include NaNs, which ``torch.equal`` calls unequal)."""
    return a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8),
                                              b.contiguous().view(torch.uint8))


def at(x: torch.Tensor, blk: int, slot: int) -> tuple[int, int]:
    """Index of token ``slot`` of manager block ``blk`` in a ``[kernel blocks, n, ...]``
    plane (kernel block j of block b is ``b * ratio + j``; ratio 1 without a split)."""
    n = x.shape[1]
    r = s.BLOCK // n
    return blk * r + slot // n, slot % n


def reads(e: dict[str, Any], bufs: dict[str, torch.Tensor], name: str) -> Any:
    spec = e["specs"][name]
    if isinstance(spec, MambaSpec):
        return vb.state_views(spec, bufs[name])
    return vb.kv_planes(e["backend"], bufs[name], spec.head_size)


CASES = [(b, lay.name) for b in vb.BACKENDS for lay in KVCacheLayout]


@pytest.mark.parametrize("backend, layout", CASES)
def test_register_save_load_on_vllms_own_buffers(model: tuple[Any, Any], backend: str,
                                                 layout: str) -> None:
    check_save_load(setup(model, backend, layout))


@pytest.mark.parametrize("layout", ["LBNHC", "BLNHC", "LBHNC"])
def test_kernel_block_split(model: tuple[Any, Any], layout: str) -> None:
    """A backend that splits a 32-token block into two 16-token kernel blocks: vLLM then
    hands views of 2 x blocks; with NHD blocks the two halves form one token axis and move
    exactly, with HND ones they do not and registration fails closed."""
    e = setup(model, "FLASH_ATTN", layout, kernel_block=16)
    assert e["bufs"]["model.layers.1.mixer.attn"].shape[:3] == (2 * e["cfg"].num_blocks, 2, 16)
    if layout == "LBHNC":
        conn = KVConnectorFactory.create_connector(e["vc"], KVConnectorRole.WORKER, e["cfg"])
        try:
            with pytest.raises(HybridStartupError, match="kernel blocks of 16 tokens"):
                conn.register_kv_caches(e["bufs"])
        finally:
            conn.shutdown()
        return
    check_save_load(e)


@pytest.mark.parametrize("arch", ["qwen3_next", "mamba2"])
@pytest.mark.parametrize("layout", ["LBNHC", "BLNHC"])
def test_other_models(root: Any, arch: str, layout: str) -> None:
    """Qwen3-Next (three GDN groups aliasing the attention group's allocation) and a pure
    Mamba2 model, whose layers vLLM packs into one tensor: layer after layer (LBNHC) or
    interleaved block by block (BLNHC: a block stride of two pages)."""
    check_save_load(setup((s.MODELS[arch](root), root / "hybrid.yaml"), "FLASH_ATTN", layout))


def check_save_load(e: dict[str, Any]) -> None:
    """Register ``e``'s buffers, save KV and states from some blocks and load them into
    others (see the module docstring)."""
    conn = KVConnectorFactory.create_connector(e["vc"], KVConnectorRole.WORKER, e["cfg"])
    try:
        conn.register_kv_caches(e["bufs"])
        w = conn.worker
        bs, n = s.BLOCK, 80  # two whole blocks and a partial third
        groups = w.groups
        ng = groups.num_groups
        # vLLM's block pool gives each group its own blocks of the shared allocation
        perm = torch.randperm(w.num_blocks, generator=torch.Generator().manual_seed(1)).tolist()
        assert 6 * ng <= w.num_blocks
        src_ids = tuple(tuple(perm[6 * g : 6 * g + 3]) for g in range(ng))
        dst_ids = tuple(tuple(perm[6 * g + 3 : 6 * g + 6]) for g in range(ng))
        raw = vb.backing(e["bufs"])

        # save: the KV of tokens [0, 80) and the state at 80 (block 2 of each Mamba group)
        kv = kv_layout(w.geometry, n).unpack(w.gather_kv(src_ids, 0, n)) if groups.attention else {}
        for g, name in groups.attention:
            k, v = reads(e, e["bufs"], name)
            i = layer_index(name)
            for t in range(n):
                blk, slot = src_ids[g][t // bs], t % bs
                assert same(kv[f"layers.{i}.k"][t], k[at(k, blk, slot)]), (name, t)
                assert same(kv[f"layers.{i}.v"][t], v[at(v, blk, slot)]), (name, t)
        st_blocks = {g: src_ids[g][2] for g in groups.recurrent_groups}
        state = w.gather_state(st_blocks)
        parts = w.state_layout.unpack(state)
        for g, name in groups.recurrent:
            for j, ts in enumerate(reads(e, e["bufs"], name)):
                got = parts[f"layers.{layer_index(name)}.s{j}"]
                assert same(got.reshape(ts[0].shape), ts[st_blocks[g]]), (name, j)

        # load into other blocks: exactly those tokens and states change, nothing else
        want_raw = raw.clone()
        want = twin(e["bufs"], want_raw)
        for g, name in groups.attention:
            k, v = reads(e, e["bufs"], name)
            wk, wv = reads(e, want, name)
            for t in range(n):
                a, b = src_ids[g][t // bs], dst_ids[g][t // bs]
                wk[at(wk, b, t % bs)] = k[at(k, a, t % bs)]
                wv[at(wv, b, t % bs)] = v[at(v, a, t % bs)]
        for g, name in groups.recurrent:
            for ts, wts in zip(reads(e, e["bufs"], name), reads(e, want, name), strict=True):
                wts[dst_ids[g][2]] = ts[src_ids[g][2]]
        assert not torch.equal(want_raw, raw)  # the load has bytes to write
        if groups.attention:
            w.scatter_kv(w.gather_kv(src_ids, 0, n), 0, dst_ids, 0, n)
        w.scatter_state(state, {g: dst_ids[g][2] for g in groups.recurrent_groups})
        diff = (raw != want_raw).nonzero().flatten()
        assert diff.numel() == 0, f"{diff.numel()} bytes differ, first at byte {int(diff[0])}"
    finally:
        conn.shutdown()


# one resolved layout per backend for the heavier end-to-end run (every resolved layout is
# covered by the test above): both in-block orders and a block-outer one
SERVED = [("FLASH_ATTN", "LBHNC"), ("TRITON_ATTN", "BLNHC"), ("FLEX_ATTENTION", "LBNHC"),
          ("CPU_ATTN", "LBHNC"), ("FLASHINFER", "LBHNC")]


@pytest.mark.parametrize("backend, layout", SERVED)
def test_hits_through_vllms_scheduler_on_each_backends_buffers(model: tuple[Any, Any], backend: str,
                                                               layout: str) -> None:
    """vLLM's Scheduler serving shared prefixes one after another, each request's saves
    stored before the next arrives and vLLM's prefix cache emptied, so the hits come from
    the connector: every KV and state byte the "model"
    reads (as the backend reads it) is checked."""
    import numpy as np
    import vllm_harness as h

    e = setup(model, backend, layout)
    vc, cfg = e["vc"], e["cfg"]
    sched = h.make_scheduler(vc, cfg)
    conn = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, cfg)
    runner = h.Runner(cfg, conn, backend=backend, layout=layout)
    try:
        rng = np.random.default_rng(5)
        base = rng.integers(0, 128, 200).tolist()
        reqs = [h.make_request(f"r{i}", base[: 100 + 40 * i] + rng.integers(0, 128, 10).tolist(), 4)
                for i in range(3)]
        for req in reqs:
            h.run(sched, runner, [req])
            conn.worker.flush(timeout=120)  # its saves stored (they run on the worker's lanes)
            so = sched.schedule()  # and reported to the scheduler's index
            sched.update_from_output(so, runner.step(so))
            assert sched.reset_prefix_cache()  # the next hit must come from the connector
        st = sched.connector.sched.stats
        assert runner.bad == [], runner.bad[:3]
        assert st.hits >= 2 and st.failed_loads == 0 and st.loaded_tokens > 0
        assert runner.checked_tokens >= st.loaded_tokens
    finally:
        conn.shutdown()
        sched.connector.shutdown()
