"""Requests whose KV differs for the same token ids, through vLLM 0.33.0's own Scheduler.

vLLM's block hashes mix in a request's cache salt, LoRA adapter, multimodal inputs and
prompt embeddings (``generate_block_hash_extra_keys``); the connector's index is keyed by
token ids. A prefix one tenant (salt) or adapter saved must not be served to another, an
image's KV must not be served behind another image's identical placeholder tokens, and a
request whose inputs are embeddings (placeholder ids) is never served. The runner's model
depends on the adapter, so adapter KV served across adapters fails its byte check."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import vllm_harness as h  # noqa: E402
import vllm_support as s  # noqa: E402

PROMPT = 150  # ends inside a block: a tail past the last boundary (128)


def _engine(root: Path) -> tuple[Any, Any, h.Runner]:
    return h.engine(root, s.BASE_YAML, retention=None, num_blocks=16, name="ns.yaml")


def _serve(sched: Any, runner: h.Runner, req: Any) -> int:
    """Serve ``req`` after vLLM forgot its own prefix cache, let its saves land; returns the
    tokens the connector loaded for it."""
    side = sched.connector.sched
    assert sched.reset_prefix_cache()
    before = side.stats.hit_tokens
    h.run(sched, runner, [req])
    for _ in range(200):  # until every save of it is reported and its blocks are freed
        if not (sched.requests or side._open or side._finish_saves):
            break
        so = sched.schedule()
        sched.update_from_output(so, runner.step(so))
    return int(side.stats.hit_tokens - before)


@contextmanager
def _saved(root: Path, prompt: list[int]) -> Iterator[Any]:
    """The scheduler side of an engine that served ``prompt`` (its saves landed), checked
    to hit for the same request again (the control)."""
    sched, worker, runner = _engine(root)
    try:
        _serve(sched, runner, h.make_request("saved", prompt, 1))
        side = sched.connector.sched
        assert side.match(h.make_request("control", prompt, 1), 0)[0] >= 128
        yield side
    finally:
        worker.shutdown()
    assert runner.bad == []


def _prompt(seed: int = 3) -> list[int]:
    return np.random.default_rng(seed).integers(1, 128, PROMPT).tolist()


def _lora(name: str, lora_id: int) -> Any:
    from vllm.lora.request import LoRARequest

    return LoRARequest(name, lora_id, f"/adapters/{name}")


def test_a_salted_prefix_is_served_to_its_own_salt_only(tmp_path: Path) -> None:
    """Alice's saved prompt hits for Alice again, never for Bob nor for an unsalted request
    with the same tokens (vLLM's own cache keeps them apart by the salt too)."""
    sched, worker, runner = _engine(tmp_path)
    try:
        p = _prompt()
        assert _serve(sched, runner, h.make_request("a1", p, 1, cache_salt="alice")) == 0
        assert _serve(sched, runner, h.make_request("b1", p, 1, cache_salt="bob")) == 0
        assert _serve(sched, runner, h.make_request("n1", p, 1)) == 0
        assert _serve(sched, runner, h.make_request("a2", p, 1, cache_salt="alice")) >= 128
        assert _serve(sched, runner, h.make_request("b2", p, 1, cache_salt="bob")) >= 128
    finally:
        worker.shutdown()
    assert runner.bad == []


def test_an_adapters_kv_is_served_to_that_adapter_only(tmp_path: Path) -> None:
    """The runner's model differs per adapter: adapter A's KV and states loaded for adapter
    B (or the base model) would fail its byte check. Each gets its own prefix, exactly."""
    sched, worker, runner = _engine(tmp_path)
    try:
        p = _prompt(4)
        assert _serve(sched, runner, h.make_request("a1", p, 1, lora_request=_lora("a", 1))) == 0
        assert _serve(sched, runner, h.make_request("b1", p, 1, lora_request=_lora("b", 2))) == 0
        assert _serve(sched, runner, h.make_request("base", p, 1)) == 0
        assert runner.bad == []
        for rid, lora in (("a2", _lora("a", 1)), ("b2", _lora("b", 2)), ("base2", None)):
            assert _serve(sched, runner, h.make_request(rid, p, 1, lora_request=lora)) >= 128
    finally:
        worker.shutdown()
    assert runner.bad == []


def _image(identifier: str, offset: int, length: int = 20) -> Any:
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    return MultiModalFeatureSpec(data=None, modality="image", identifier=identifier,
                                 mm_position=PlaceholderRange(offset=offset, length=length))


def test_an_image_prefix_is_shared_only_up_to_its_placeholder(tmp_path: Path) -> None:
    """A text-only request saved the same token ids (placeholders included): a request with
    an image at 40 may hit at most there, where the image's tokens begin. (vLLM's scheduler
    cannot schedule encoder inputs for a text-only model: asked at vLLM's hit query.)"""
    p = _prompt(5)
    with _saved(tmp_path, p) as side:
        got, _ = side.match(h.make_request("img", p, 1, mm_features=[_image("cat", 40)]), 0)
        assert (got or 0) <= 40


def test_a_request_of_prompt_embeddings_is_never_served_or_saved(tmp_path: Path) -> None:
    """Its token ids are placeholders (zeros): a text prompt of zeros saved before must not
    hit for it, and nothing of it is tracked for saving."""
    import torch

    with _saved(tmp_path, [0] * PROMPT) as side:
        emb = h.make_request("emb", None, 1, prompt_embeds=torch.zeros(PROMPT, 8))
        assert side.match(emb, 0) == (0, False)
        assert "emb" not in side._progress
        assert side.finished(emb) is False


def test_a_hit_whose_keys_are_not_the_requests_own_hashes_is_refused(tmp_path: Path) -> None:
    """Defence beyond the namespaces: an object is served only when its key is the
    requesting request's own block hash at its end. A request hashed with another function
    (as an input vLLM mixes in that the connector does not know of would make it) gets no
    hit from the same token ids."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    p = _prompt(6)
    with _saved(tmp_path, p) as side:
        other = Request("other", p, SamplingParams(max_tokens=1), None,
                        block_hasher=get_request_block_hasher(s.BLOCK, sha256_cbor))
        assert side.match(other, 0) == (0, False)
        assert side.stats.foreign_refused == 1


def _variants() -> dict[str, dict[str, Any]]:
    return {
        "plain": {}, "salt x": {"cache_salt": "x"}, "salt y": {"cache_salt": "y"},
        "lora a": {"lora_request": _lora("a", 1)}, "lora b": {"lora_request": _lora("b", 2)},
        "lora a moved": {"lora_request": _lora("a", 1).__class__("a", 1, "/elsewhere/a")},
        "cat@40": {"mm_features": [_image("cat", 40)]},
        "dog@40": {"mm_features": [_image("dog", 40)]},
        "cat@70": {"mm_features": [_image("cat", 70)]},
        "cat@40 dog@100": {"mm_features": [_image("cat", 40), _image("dog", 100)]},
        "cat@40 cow@100": {"mm_features": [_image("cat", 40), _image("cow", 100)]},
        "salt x cat@40": {"cache_salt": "x", "mm_features": [_image("cat", 40)]},
    }


def test_lifted_ids_part_exactly_where_vllms_block_hashes_do() -> None:
    """For every pair of inputs, at every block end: vLLM's block hashes (its own hasher)
    are equal exactly when the lifted ids up to there are equal."""
    from hybrid_connector.integrations.vllm.namespace import lifter

    p = _prompt(7)
    reqs = {name: h.make_request(name, p, 1, **kw) for name, kw in _variants().items()}
    lifted = {}
    for name, r in reqs.items():
        lift = lifter(r)
        arr = np.asarray(p, dtype=np.int64)
        lifted[name] = lift(arr, 0) if lift is not None else arr
    assert lifter(reqs["plain"]) is None  # the common case costs nothing
    names = list(reqs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for k, (ha, hb) in enumerate(zip(reqs[a].block_hashes, reqs[b].block_hashes,
                                             strict=True)):
                end = (k + 1) * s.BLOCK
                same = bool(np.array_equal(lifted[a][:end], lifted[b][:end]))
                assert (ha == hb) == same, (a, b, end)


def test_ids_too_large_to_lift_are_refused() -> None:
    from hybrid_connector.integrations.vllm.namespace import TOKEN_BITS, lifter

    lift = lifter(h.make_request("r", [1, 2], 1, cache_salt="x"))
    assert lift is not None
    with pytest.raises(ValueError, match="namespaced"):
        lift(np.asarray([1, 1 << TOKEN_BITS], dtype=np.int64), 0)
