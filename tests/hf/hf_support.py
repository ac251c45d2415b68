"""Fixtures for the transformers runtime tests: tiny random-weight hybrid models on CPU."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from hybrid_connector.core.config import HybridConfig, load_config  # noqa: E402
from hybrid_connector.core.keys import ObjectKind  # noqa: E402
from hybrid_connector.geometry.tiny import tiny_hf_model  # noqa: E402
from hybrid_connector.integrations.hf.quality import long_memory_  # noqa: E402
from hybrid_connector.integrations.hf.runtime import HFRuntime  # noqa: E402
from hybrid_connector.integrations.hf.state import (  # noqa: E402
    HFStateAdapter,
    model_forward,
    new_model_cache,
)
from hybrid_connector.payload.layout import kv_layout  # noqa: E402
from hybrid_connector.tiers.memory import MemoryStore  # noqa: E402

ARCHS = ("qwen3_5", "qwen3_next", "nemotron_h", "bamba", "jamba", "falcon_h1", "granitemoehybrid",
         "lfm2")
# Added with issue 16, covered by the exactness tests (branch point, finished request, tiers):
# the multimodal checkpoint classes and the further hybrid families.
NEW_ARCHS = ("qwen3_5_vl", "qwen3_5_moe_vl", "lfm2_moe", "olmo_hybrid", "zamba2", "mamba",
             "mamba2", "falcon_mamba", "kimi_linear")
ALL_ARCHS = ARCHS + NEW_ARCHS


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # Tiny models are dominated by per-op overhead; two threads on a busy 2-core box make
    # every op ~20x slower. Restored after each test so other test areas are unaffected.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_model(arch: str, long_memory: bool = False, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    model = tiny_hf_model(arch)
    return long_memory_(model) if long_memory else model


def config(**over: Any) -> HybridConfig:
    # config.alignment stays at its default (16): the runtime resumes at any token (alignment 1).
    base: dict[str, Any] = {"chunk_size": 16, "hash_block_size": 16}
    base.update(over)
    return load_config(overrides=base, environ={})


def memory_store() -> MemoryStore:
    return MemoryStore({k: 1 << 30 for k in ObjectKind})


def runtime(model: Any, conf: HybridConfig | None = None, store: Any = None, **kw: Any) -> HFRuntime:
    return HFRuntime.create(model, conf or config(), store or memory_store(), **kw)


def random_tokens(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


@torch.no_grad()
def reference(model: Any, tokens: Sequence[int], n_new: int) -> tuple[torch.Tensor, list[int]]:
    """Full prefill without any connector: next-token logits and a greedy continuation."""
    mc = new_model_cache(model)
    n = len(tokens)
    logits = model_forward(model, torch.tensor([list(tokens)]), mc, torch.arange(n)[None]).logits[0, -1]
    first = logits.float()
    out: list[int] = []
    pos = n
    for _ in range(n_new):
        tok = int(logits.argmax())
        out.append(tok)
        logits = model_forward(model, torch.tensor([[tok]]), mc, torch.tensor([[pos]])).logits[0, -1]
        pos += 1
    return first, out


# --------------------------------------------------------------------------------------------
# Restored model-cache tensors against a full prefill's
#
# Logits are a weak witness of a restore on tiny random models: their recurrent states barely
# reach the output (zeroing every restored SSM state moves Nemotron-H's logits by ~1e-6), so
# exactness tests also compare the tensors themselves. Each tensor is compared relative to its
# own largest magnitude (a Nemotron-H SSM state is ~1e-5 in absolute terms). fp32 restores are
# bitwise where the checkpoint was computed exactly like the reference (same split, same
# shapes); otherwise only reduction order differs (chunked scan vs. per-token decode steps,
# GEMMs of another length), measured at <= 7e-7 of the tensor's scale (a few ulps). 1e-5
# leaves >10x headroom and still flags a 1e-4 perturbation of a single layer.
STATE_RTOL = 1e-5


@torch.no_grad()
def full_prefill_cache(model: Any, tokens: Sequence[int]) -> Any:
    """The model cache after one plain forward of ``tokens`` from an empty cache."""
    mc = new_model_cache(model)
    model_forward(model, torch.tensor([list(tokens)]), mc, torch.arange(len(tokens))[None])
    return mc


def cache_tensors(adapter: HFStateAdapter, mc: Any, p: int) -> tuple[dict[str, torch.Tensor], list[str]]:
    """What a hit at ``p`` must reproduce, read with the adapter's own extraction: K and V of
    every attention layer over ``[0, p)`` and every recurrent layer's conv state (the columns
    the adapter keeps) and recurrent state, named like the payload parts. Returns the tensors
    and the extraction errors (a cache that does not hold some of them)."""
    out: dict[str, torch.Tensor] = {}
    errors: list[str] = []
    if adapter.attention:
        try:
            out.update(kv_layout(adapter.geometry, p).unpack(adapter.extract_kv(mc, 0, p)))
        except ValueError as e:
            errors.append(f"KV: {e}")
    if adapter.recurrent:
        try:
            out.update(adapter.state_layout.unpack(adapter.extract_state(mc)))
        except ValueError as e:
            errors.append(f"state: {e}")
    return out, errors


def state_diffs(adapter: HFStateAdapter, got: Any, ref: Any, p: int) -> tuple[dict[str, float], list[str]]:
    """Per tensor of :func:`cache_tensors`, ``max |got - ref| / max |ref|`` (0.0 when bitwise
    equal, inf when ref is all zeros and got is not, nan propagates), and every structural
    difference: an attention layer not holding exactly ``p`` tokens, a recurrent state not
    marked as a previous state (the model would ignore it), a tensor missing or of another
    shape or dtype."""
    problems: list[str] = []
    for a in adapter.attention:
        keys = got.layers[a.layer].keys  # an empty layer holds None or a 1-D placeholder
        held = int(keys.shape[-2]) if isinstance(keys, torch.Tensor) and keys.dim() == 4 else 0
        if held != p:
            problems.append(f"layers.{a.layer}: KV holds {held} tokens, expected {p}")
    for s in adapter.recurrent:
        if got.layers[s.layer].has_previous_state[s.index] != ref.layers[s.layer].has_previous_state[s.index]:
            problems.append(f"layers.{s.layer}.{s.index}: has_previous_state differs from the reference")
    g, g_err = cache_tensors(adapter, got, p)
    r, r_err = cache_tensors(adapter, ref, p)
    problems += [f"restored {e}" for e in g_err] + [f"reference {e}" for e in r_err]
    diffs: dict[str, float] = {}
    for name, want in r.items():
        have = g.get(name)
        if have is None:
            continue  # reported as an extraction error
        if have.shape != want.shape or have.dtype != want.dtype:
            problems.append(f"{name}: {tuple(have.shape)} {have.dtype} != {tuple(want.shape)} {want.dtype}")
            continue
        diff = (have.double() - want.double()).abs().max().item()
        scale = want.double().abs().max().item()
        diffs[name] = 0.0 if diff == 0 else diff / scale if scale > 0 else math.inf
    return diffs, problems


def _over(diffs: dict[str, float], rtol: float) -> list[str]:
    # `not <=` so that a nan difference is a mismatch
    return [f"{name}: max |diff| = {d:.3g} x max |ref| > {rtol:g}"
            for name, d in diffs.items() if not d <= rtol]


def state_mismatches(adapter: HFStateAdapter, got: Any, ref: Any, p: int,
                     rtol: float = STATE_RTOL) -> list[str]:
    """Human-readable differences between cache ``got`` and reference cache ``ref`` at ``p``
    (empty when every tensor is within ``rtol`` of its own scale and nothing is missing)."""
    diffs, problems = state_diffs(adapter, got, ref, p)
    return problems + _over(diffs, rtol)


# Families whose transformers decode step computes another recurrent state than a prefill of
# the same tokens, connector or not: Zamba2's prefill scan clamps dt to time_step_min, its
# single-token ``selective_state_update`` does not (0.6% of the state's scale after 10
# steps on the tiny model; logits agree to 1.5e-7). A state saved after decode steps is then
# compared with the same steps run without the connector (:func:`decoded_cache`).
DECODE_STATE_DIFFERS = frozenset({"zamba2"})


@torch.no_grad()
def decoded_cache(model: Any, prompt: Sequence[int], generated: Sequence[int]) -> Any:
    """The model cache after one forward of ``prompt`` then one decode step per token of
    ``generated`` (what a request that decoded ``generated`` holds), without the connector."""
    mc = full_prefill_cache(model, prompt)
    for j, tok in enumerate(generated):
        pos = len(prompt) + j
        model_forward(model, torch.tensor([[tok]]), mc, torch.tensor([[pos]]))
    return mc


def assert_restored_exact(adapter: HFStateAdapter, model: Any, tokens: Sequence[int], got: Any,
                          p: int, rtol: float = STATE_RTOL, ref: Any = None) -> dict[str, float]:
    """Assert that cache ``got`` holds what a full prefill of ``tokens[:p]`` holds (or the
    reference cache ``ref``, when given), within ``rtol`` (see :func:`state_diffs`); returns
    the per-tensor relative differences."""
    if ref is None:
        ref = full_prefill_cache(model, tokens[:p])
    diffs, problems = state_diffs(adapter, got, ref, p)
    problems += _over(diffs, rtol)
    assert not problems, f"cache at {p} differs from a full prefill:\n  " + "\n  ".join(problems)
    return diffs


Fault = Callable[[HFStateAdapter, Any], None]


@contextmanager
def captured_restores(rt: HFRuntime, fault: Fault | None = None) -> Iterator[list[tuple[int, Any]]]:
    """Within the block, every cache the runtime restores from a checkpoint (``restore`` with
    a state) is first passed to ``fault`` (standing for a restore bug; it mutates the cache
    the runtime then uses) and then deep-copied, with its token count, into the yielded list,
    before the runtime runs the rest of the prompt into it."""
    seen: list[tuple[int, Any]] = []
    inner = rt.adapter.restore

    def restore(kv_payloads: Any, kv_ranges: Any, num_tokens: int, state: Any) -> Any:
        mc = inner(kv_payloads, kv_ranges, num_tokens, state)
        if state is not None:
            if fault is not None:
                fault(rt.adapter, mc)
            seen.append((num_tokens, copy.deepcopy(mc)))
        return mc

    rt.adapter.restore = restore  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del rt.adapter.restore  # the class's method again


def assert_exact_hit(rt: HFRuntime, model: Any, probe: Sequence[int], hit: int, n_new: int = 8) -> None:
    """Prefill ``probe`` on ``rt`` and assert a ``hit``-token exact hit whose restored cache,
    logits and ``n_new`` greedy tokens equal a full prefill's; then finish the request, check
    the cache's integrity and close the runtime and its cache."""
    with captured_restores(rt) as restored:
        rc = rt.prefill(probe)
    assert rc.info.hit_tokens == hit and rc.info.exact
    assert_restored_exact(rt.adapter, model, probe, restored[0][1], hit)
    ref_logits, ref_new = reference(model, probe, n_new)
    assert (rc.logits - ref_logits).abs().max().item() <= 1e-4
    assert rt.decode(rc, n_new) == ref_new
    rt.finish(rc)
    rt.cache.check_integrity()
    rt.close()
    rt.cache.close()


def small_tier_store(model: Any, path: Any) -> Any:
    """Device and host tiers holding about one state and three KV chunks of ``model`` (so
    older objects are pushed down as later requests save) over a large NVMe tier at
    ``path`` (no fsync)."""
    from hybrid_connector.core.keys import ObjectKind
    from hybrid_connector.tiers.device import DeviceTier
    from hybrid_connector.tiers.host import HostTier
    from hybrid_connector.tiers.manager import TieredStore
    from hybrid_connector.tiers.nvme import NvmeTier

    probe = runtime(model)
    state_b, kv_b = probe.adapter.state_nbytes(), probe.adapter.kv_nbytes(16)
    probe.close()
    small = {ObjectKind.STATE: state_b + 64, ObjectKind.KV: 3 * kv_b + 64, ObjectKind.ANCHOR: 1 << 16}
    big = dict.fromkeys(ObjectKind, 1 << 24)
    return TieredStore([DeviceTier(small, device="cpu"), HostTier(small),
                        NvmeTier(path / "nvme", big, fsync=False)])


def restored_and_twin(model: Any, split: int, seed: int, total: int = 40
                      ) -> tuple[HFRuntime, torch.Tensor, Any, Any, Any]:
    """Prefill the first ``split`` of ``total`` random tokens, then restore a fresh cache
    from that cache's own KV and state: ``(rt, tokens, restored, twin, cache)``, ``twin``
    an untouched copy of the prefilled cache (the reference a restore must continue like)."""
    rt = runtime(model)
    toks = torch.tensor(random_tokens(total, model.config.get_text_config().vocab_size, seed))
    mc = new_model_cache(model)
    rt.run_tokens(toks[:split], mc, 0)
    twin = copy.deepcopy(mc)
    restored = rt.adapter.restore([rt.adapter.extract_kv(mc, 0, split)], [(0, split)], split,
                                  rt.adapter.extract_state(mc))
    return rt, toks, restored, twin, mc
