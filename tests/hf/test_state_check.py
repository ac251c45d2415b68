"""The restored-state check catches what the logits check misses.

On the tiny random models most recurrent states barely reach the logits: a restore that loses
every SSM state still gave logits within 1e-4 and the same greedy continuation in the old
exactness tests for every family but Qwen3.5 (Nemotron-H moves by ~1e-6, Falcon-H1 by ~1e-7),
and a zeroed conv state passed them for Jamba, Falcon-H1 and LFM2. These tests corrupt the
cache the runtime restores (a restore bug) and show that :func:`hf_support.state_mismatches`
flags each corruption, whatever the logits do.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from hf_support import (
    ARCHS,
    Fault,
    captured_restores,
    full_prefill_cache,
    random_tokens,
    reference,
    runtime,
    state_mismatches,
    tiny_model,
)

from hybrid_connector.integrations.hf.runtime import HFRuntime
from hybrid_connector.integrations.hf.state import HFStateAdapter

TOL = 1e-4  # the logits tolerance of the exactness tests
P = 70  # the checkpoint every corrupted restore starts from
PERTURB = 1e-4  # relative size of a "slight" perturbation: 10x the state check's tolerance


def _noise(t: torch.Tensor) -> None:
    """Add seeded noise of std PERTURB x max |t| to ``t`` (in place)."""
    g = torch.Generator().manual_seed(0)
    t.add_(torch.randn(t.shape, generator=g, dtype=t.dtype) * (PERTURB * t.abs().max()))


def zero_recurrent(ad: HFStateAdapter, mc: Any) -> None:
    for s in ad.recurrent:
        if s.rec_shape is not None:
            mc.layers[s.layer].recurrent_states[s.index].zero_()


def perturb_recurrent(ad: HFStateAdapter, mc: Any) -> None:
    s = next(s for s in ad.recurrent if s.rec_shape is not None)  # one layer only
    _noise(mc.layers[s.layer].recurrent_states[s.index])


def zero_conv(ad: HFStateAdapter, mc: Any) -> None:
    for s in ad.recurrent:
        mc.layers[s.layer].conv_states[s.index].zero_()


def perturb_conv(ad: HFStateAdapter, mc: Any) -> None:
    s = ad.recurrent[-1]
    _noise(mc.layers[s.layer].conv_states[s.index])


def drop_kv(ad: HFStateAdapter, mc: Any) -> None:
    """The last attention layer loses its KV (the first still reports p tokens)."""
    layer = mc.layers[ad.attention[-1].layer]
    layer.keys, layer.values = layer.keys[..., :0, :], layer.values[..., :0, :]


FAULTS: dict[str, Fault] = {f.__name__: f for f in
                            (zero_recurrent, perturb_recurrent, zero_conv, perturb_conv, drop_kv)}
HAS_RECURRENT_STATE = tuple(a for a in ARCHS if a != "lfm2")  # LFM2's short conv has none
CASES = [(a, f) for a in ARCHS for f in FAULTS if a in HAS_RECURRENT_STATE or "recurrent" not in f]

_CHECKPOINTED: dict[str, tuple[Any, HFRuntime, list[int]]] = {}


def _checkpointed(arch: str) -> tuple[Any, HFRuntime, list[int]]:
    """A runtime whose cache holds a checkpoint at P (the final state of a request of P
    tokens), shared by the tests of one architecture: each hit sends its own suffix."""
    if arch not in _CHECKPOINTED:
        model = tiny_model(arch)
        rt = runtime(model)
        prefix = random_tokens(P, model.config.vocab_size, 1)
        rt.finish(rt.prefill(prefix))
        _CHECKPOINTED[arch] = (model, rt, prefix)
    return _CHECKPOINTED[arch]


def _hit(arch: str, seed: int, fault: Fault | None = None) -> tuple[Any, HFRuntime, list[int], Any, Any]:
    """Prefill prefix + 12 new tokens, hitting the checkpoint at P through a restore
    corrupted by ``fault``: the model, runtime, prompt, prefill result and restored cache."""
    model, rt, prefix = _checkpointed(arch)
    prompt = prefix + random_tokens(12, model.config.vocab_size, seed)
    with captured_restores(rt, fault) as restored:
        res = rt.prefill(prompt)
    assert res.info.hit_tokens == P and res.info.exact and [p for p, _ in restored] == [P]
    return model, rt, prompt, res, restored[0][1]


_CLEAN: dict[str, tuple[list[int], Any, Any]] = {}


def _clean_hit(arch: str) -> tuple[list[int], Any, Any]:
    """One uncorrupted hit at P per architecture: its prompt, the restored cache and the
    cache of a full prefill of ``prompt[:P]``."""
    if arch not in _CLEAN:
        model, _, prompt, _, restored = _hit(arch, 100)
        _CLEAN[arch] = (prompt, restored, full_prefill_cache(model, prompt[:P]))
    return _CLEAN[arch]


@pytest.mark.parametrize("arch", ARCHS)
def test_state_check_passes_clean_restore(arch: str) -> None:
    """The control of the controls: the uncorrupted restore passes the state check."""
    _, rt, _ = _checkpointed(arch)
    _, got, ref = _clean_hit(arch)
    assert state_mismatches(rt.adapter, got, ref, P) == []


@pytest.mark.parametrize(("arch", "fault"), CASES)
def test_state_check_flags_corrupted_restore(arch: str, fault: str) -> None:
    """Every corruption of a restored cache is flagged, including those that leave the
    logits within the exactness tests' tolerance. The fault is applied to a copy of a clean
    restore (a dropped KV layer would make the runtime's own saving fail, hiding the
    point); the rest of the prompt runs through it as the runtime would run it."""
    model, rt, _ = _checkpointed(arch)
    prompt, clean, ref = _clean_hit(arch)
    got = copy.deepcopy(clean)
    FAULTS[fault](rt.adapter, got)
    problems = state_mismatches(rt.adapter, got, ref, P)
    assert problems, f"{fault} on {arch} was not flagged"
    if fault == "drop_kv":
        assert f"layers.{rt.adapter.attention[-1].layer}: KV holds 0 tokens, expected {P}" in problems
    if fault == "zero_recurrent" and arch in ("nemotron_h", "falcon_h1"):
        # The logits-only assertion would have passed: the state check is what catches it.
        logits = rt.run_tokens(torch.tensor(prompt[P:]), got, P, all_logits=False)[-1]
        assert (logits - reference(model, prompt, 0)[0]).abs().max().item() <= TOL


@pytest.mark.parametrize("arch", ["qwen3_next", "nemotron_h", "bamba", "jamba", "falcon_h1",
                                  "granitemoehybrid"])
def test_lost_ssm_state_regression(arch: str) -> None:
    """Regression (issue 9 item 23): a restore that loses every SSM state passed the old
    exactness assertions (logits within 1e-4 and an identical greedy continuation); only
    the comparison of the restored tensors with a full prefill's detects it."""
    model, rt, prompt, res, got = _hit(arch, 200, zero_recurrent)
    ref_logits, ref_new = reference(model, prompt, 16)
    # The old assertions, unchanged: they pass although the state was lost.
    assert (res.logits - ref_logits).abs().max().item() <= TOL
    assert rt.decode(res, 16) == ref_new
    # The new one fails, naming every recurrent layer's state.
    problems = state_mismatches(rt.adapter, got, full_prefill_cache(model, prompt[:P]), P)
    ssm = {s.layer for s in rt.adapter.recurrent if s.rec_shape is not None}
    assert {int(m.split(".")[1]) for m in problems if "recurrent_state" in m} == ssm
