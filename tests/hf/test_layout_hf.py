"""The transformers runtime packs exactly the geometry's payload layout
(``hybrid_connector.payload.layout``), byte for byte what each family's cache holds, and moves the
bytes through ``hybrid_connector/kernels/``: on the torch path, and on the CUDA path (the real ``.cu`` sources
compiled for the host) with bit-identical results."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_support import ARCHS, config, random_tokens, runtime, state_mismatches, tiny_model

from hybrid_connector import kernels
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.integrations.hf.state import HFStateAdapter, decoder_layers, new_model_cache
from hybrid_connector.payload.layout import anchor_layout, kv_layout, state_layout
from hybrid_connector.policies.admission.anchors import anchor_block_bytes

PAGE, RHO = 16, 0.25


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


@contextmanager
def dispatches() -> Iterator[list[tuple[str, str]]]:
    """Within the block, ``(kernels function, its caller)`` for every call that reaches the
    kernels' dispatch point (``kernels._launcher_for``)."""
    seen: list[tuple[str, str]] = []
    inner = kernels._launcher_for

    def spy(t: torch.Tensor) -> Any:
        seen.append((sys._getframe(1).f_code.co_name, sys._getframe(2).f_code.co_name))
        return inner(t)

    kernels._launcher_for = spy
    try:
        yield seen
    finally:
        kernels._launcher_for = inner


class _Entries:
    """Records the hidden states entering each recurrent group's first layer (batch row 0),
    independently of the runtime's recorder: the reference for the anchor rows."""

    def __init__(self, model: Any, groups: tuple[tuple[int, ...], ...]) -> None:
        self.rows: list[list[torch.Tensor]] = [[] for _ in groups]
        layers = decoder_layers(model)
        self.handles = [layers[g[0]].register_forward_pre_hook(self._hook(i), with_kwargs=True)
                        for i, g in enumerate(groups)]

    def _hook(self, i: int) -> Any:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            h = args[0] if args else kwargs["hidden_states"]
            self.rows[i].append(h[0].detach().clone())
        return hook

    def close(self) -> list[torch.Tensor]:
        for h in self.handles:
            h.remove()
        return [torch.cat(r) for r in self.rows]


@pytest.mark.parametrize("arch", ARCHS)
def test_payloads_are_the_cache_bytes(arch: str) -> None:
    """KV chunk, state checkpoint and anchor block hold, part by part and bit for bit, what
    the model's cache holds (and the hidden states entering each group), in the layout the
    geometry describes, at the sizes the cache checks."""
    model = tiny_model(arch)
    rt = runtime(model, config(anchor_page_size=PAGE, anchor_density=RHO), anchors=True)
    geo, ad = rt.geometry, rt.adapter
    assert rt.layout == anchor_layout(geo, PAGE, RHO) and ad.state_layout == state_layout(geo)
    toks = torch.tensor(random_tokens(37, model.config.vocab_size, 11))
    mc = new_model_cache(model)
    entries = _Entries(model, geo.recurrent_groups())
    rt.recorder.reset()  # type: ignore[union-attr]
    rt.run_tokens(toks[:20], mc, 0)
    rt.run_tokens(toks[20:], mc, 20)  # anchor pages filled across two forwards
    hidden = entries.close()

    if geo.attention_layers:
        kv = ad.extract_kv(mc, 5, 21)
        lay = kv_layout(geo, 16)
        assert [(p.name, p.shape, p.dtype) for p in lay.parts] == \
            [(s.name, s.shape, s.dtype) for s in kv_layout(geo, 16).specs]
        assert _bits(kv).numel() == 16 * geo.kv_bytes_per_token()
        parts = lay.unpack(kv)
        for i in geo.attention_layers:
            layer = mc.layers[i]
            assert torch.equal(parts[f"layers.{i}.k"], layer.keys[0, :, 5:21].transpose(0, 1))
            assert torch.equal(parts[f"layers.{i}.v"], layer.values[0, :, 5:21].transpose(0, 1))

    state = ad.extract_state(mc)
    assert _bits(state).numel() == geo.state_bytes()
    parts = state_layout(geo).unpack(state)
    for s in ad.recurrent:
        layer = mc.layers[s.layer]
        assert torch.equal(parts[f"layers.{s.layer}.conv_state"], layer.conv_states[s.index][0, ..., 1:])
        if s.rec_shape is not None:
            assert torch.equal(parts[f"layers.{s.layer}.recurrent_state"],
                               layer.recurrent_states[s.index][0])

    pages = rt.recorder.pages(37)  # type: ignore[union-attr]
    assert [(p.start, p.end) for p in pages] == [(0, 16), (16, 32)]
    for item in pages:
        assert _bits(item.payload).numel() == anchor_block_bytes(geo, PAGE, RHO) == rt.layout.nbytes
        pos = list(rt.layout.positions(item.start))
        for g, rows in enumerate(rt.layout.unpack(item.payload)):
            assert torch.equal(rows, hidden[g][pos])
    rt.close()


def test_production_path_runs_the_kernels() -> None:
    """Saving (KV chunks, checkpoints, anchor pages) and restoring (KV, conv and recurrent
    states) go through the kernels' dispatch point, from the runtime's own code."""
    model = tiny_model("bamba")
    rt = runtime(model, config(anchor_page_size=PAGE, anchor_density=RHO, replay=True),
                 anchors=True)
    vocab = model.config.vocab_size
    a = random_tokens(40, vocab, 1)
    with dispatches() as saving:
        rt.finish(rt.prefill(a))
    with dispatches() as restoring:
        rb = rt.prefill(a + random_tokens(9, vocab, 2))
    assert rb.info.hit_tokens == 40 and rb.info.exact
    assert {("pack_anchors", "gather_kv"), ("pack_anchors", "gather_conv"),
            ("pack_anchors", "hook"), ("copy_state_pages", "copy_states")} <= set(saving)
    # whole KV chunks in one call each (scatter_kv_chunk), conv rows, states as pages
    assert {("unpack_anchors", "scatter_kv_chunk"), ("unpack_anchors", "scatter_conv"),
            ("copy_state_pages", "copy_states")} <= set(restoring)
    rt.close()


# ------------------------------------------------------------------------------------------
# the CUDA path, run on the host


def _host_launcher() -> Any:
    path = Path(__file__).resolve().parents[1] / "kernels" / "kernels_host_launcher.py"
    spec = importlib.util.spec_from_file_location("kernels_host_launcher_hf", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        return mod.HostLauncher()
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def host() -> Any:
    return _host_launcher()


@pytest.mark.parametrize("arch", ["qwen3_5", "lfm2"])
def test_cuda_kernels_give_the_torch_bytes(host: Any, arch: str) -> None:
    """Extraction, anchor capture and restore through the CUDA kernels (host-compiled) give
    the same payloads and the same restored cache, bit for bit, as the torch path."""
    model = tiny_model(arch)
    rt = runtime(model, config(anchor_page_size=PAGE, anchor_density=RHO), anchors=True)
    toks = torch.tensor(random_tokens(35, model.config.vocab_size, 4))
    payloads: dict[str, list[torch.Tensor]] = {}
    restored: dict[str, Any] = {}
    for path in ("torch", "cuda"):
        mc = new_model_cache(model)
        rt.recorder.reset()  # type: ignore[union-attr]
        before = len(host.launches)
        with kernels.use_launcher(host) if path == "cuda" else kernels.torch_only():
            rt.run_tokens(toks, mc, 0)
            kv = [rt.adapter.extract_kv(mc, 0, 16), rt.adapter.extract_kv(mc, 16, 35)]
            state = rt.adapter.extract_state(mc)
            pages = [p.payload for p in rt.recorder.pages(35)]  # type: ignore[union-attr]
            restored[path] = rt.adapter.restore(kv, [(0, 16), (16, 35)], 30, state)
        if path == "cuda":
            names = {k for k, _, _ in host.launches[before:]}
            assert any(n.startswith("hc_rows_copy") for n in names)
            assert any(n.startswith("hc_copy_pages") for n in names) == (arch != "lfm2")  # LFM2: conv only
        payloads[path] = [*kv, state, *pages]
    assert len(payloads["torch"]) == len(payloads["cuda"]) == 5
    for t, c in zip(payloads["torch"], payloads["cuda"], strict=True):
        assert torch.equal(_bits(t), _bits(c))
    got, ref = restored["cuda"], restored["torch"]
    assert not state_mismatches(rt.adapter, got, ref, 30, rtol=0.0)
    for s in rt.adapter.recurrent:  # the whole conv state, padding column included
        assert torch.equal(got.layers[s.layer].conv_states[s.index], ref.layers[s.layer].conv_states[s.index])
    rt.close()


@pytest.mark.parametrize(("over", "why"), [
    ({"dtype": "bfloat16"}, r"layer \d+ caches K of 2 x \d+ torch.float32 per token, the "
                            r"geometry's layout says 2 x \d+ torch.bfloat16"),
    ({"state_dtype": "bfloat16"}, r"layer 0 recurrent state .*torch.float32.*, the geometry's "
                                  r"layout says .*torch.bfloat16"),
])
def test_adapter_refuses_a_cache_the_layout_does_not_describe(over: dict[str, str], why: str) -> None:
    model = tiny_model("qwen3_5")
    geo = ModelGeometry.from_hf_config(model.config, **{"dtype": "float32", **over})
    with pytest.raises(ValueError, match=why):
        HFStateAdapter(model, geo)
