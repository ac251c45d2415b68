"""transformers runtime: cached prefill and greedy generation for hybrid causal LMs.

Supported (batch size 1, fp32/bf16, transformers 5.20; tested on CPU, tensors follow the
model's device but no GPU run has been made): Qwen3.5 and Qwen3.5-MoE (text, and the
multimodal ``...ForConditionalGeneration`` classes: their text decoder), Qwen3-Next,
Nemotron-H, Bamba, Jamba, Falcon-H1, GraniteMoeHybrid, LFM2, LFM2-MoE, OLMo-hybrid, Zamba2,
and the state-only Mamba, Mamba2, FalconMamba (no attention: every hit is a checkpoint),
i.e. every family whose cache is a ``DynamicCache`` of ``DynamicLayer`` /
``LinearAttentionLayer`` / ``LinearAttentionAndFullAttentionLayer`` objects (see
``hf_state``). Suffix replay is refused for Zamba2 (``hf_replay.NO_REPLAY``). Not supported: batches,
padding masks, static caches, and layers a KV chunk cannot hold: sliding-window attention,
indexed (DSA) attention, K and V of different head sizes (multi-head latent attention, as in
Kimi Linear); ``create`` and the constructor refuse those with a ValueError naming the layer.

One request, as :meth:`HFRuntime.prefill` runs it through a ``RequestSession``::

    s = RequestSession(cache, prompt, gate=...)   # exact checkpoint, replay or miss
                                                  # (a replay the gate refuses: exact plan)
    loaded = s.load(); model_cache = restore(KV [0, p), state at p)   # or replay anchors
    s.release()
    run prompt[p:], split at every s.checkpoints q: run [.., q), snapshot, continue
    s.save_prefill(KV chunks, checkpoints, anchor pages)

:meth:`HFRuntime.decode` continues greedily; :meth:`HFRuntime.finish` saves the last KV
chunks, anchors and the final state (admission decides) through ``s.finish``.

**Intermediate states.** A recurrent state exists only where the model stopped, so a
checkpoint at p (a branch point, a placement pick) is taken by splitting the prefill at p.
Every family resumes a multi-token forward from a restored state exactly, except the Mamba
(v1) ones, Jamba, Mamba and FalconMamba: their selective scan (like mamba_ssm's
``selective_scan_fn``) takes no initial state, so after a restore or a split they run the
remaining tokens one at a time through the single-token recurrent path (exact, slower). Bamba derives ``position_ids`` from 0 when
none are passed, so the runtime always passes absolute positions.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hybrid_connector import assemble
from hybrid_connector.core.config import HybridConfig
from hybrid_connector.geometry.anchors import configured_anchors
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.geometry.weights import model_identity
from hybrid_connector.index.plan import LoadPlan, LoadResult, SaveResult
from hybrid_connector.integrations.hf.anchors import AnchorLayout, AnchorRecorder
from hybrid_connector.integrations.hf.replay import gather_anchors, refuse_replay, replay_states
from hybrid_connector.integrations.hf.state import HFStateAdapter, model_forward, new_model_cache
from hybrid_connector.payload.layout import anchor_layout
from hybrid_connector.runtime.api import CacheAPI
from hybrid_connector.runtime.session import RequestSession
from hybrid_connector.runtime.suffix_replay import ReplayGate
from hybrid_connector.tiers.store import ObjectStore

log = logging.getLogger(__name__)

# Families whose multi-token forward ignores a restored recurrent state (see module doc).
_STEPWISE_RESUME = frozenset({"jamba", "mamba", "falcon_mamba"})


@dataclass
class PrefillInfo:
    """What a cached prefill did. ``exact`` is False only for a replayed hit (labelled);
    ``hit_tokens`` is the restored prefix p, ``computed_tokens`` what the model ran."""

    prompt_tokens: int
    hit_tokens: int = 0
    exact: bool = True
    replayed: bool = False
    replay_anchors: int = 0
    computed_tokens: int = 0
    checkpoints: tuple[int, ...] = ()
    gate_rejected: bool = False
    load_failed: int = 0
    saved: SaveResult | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ttft(self) -> float:
        """Seconds from lookup to the first next-token logits (saves excluded)."""
        return self.seconds.get("ttft", 0.0)


@dataclass
class PrefillResult:
    """A running request: next-token ``logits`` ``[vocab]``, the model's cache, what the
    prefill did, and every token the model has consumed so far (mutated by ``decode``)."""

    logits: torch.Tensor
    model_cache: Any
    info: PrefillInfo
    tokens: list[int]
    session: RequestSession  # the request's life against the cache (saves, finish)
    finished: bool = False


def geometry_for(model: Any) -> ModelGeometry:
    """The model's geometry in the dtype its weights actually have."""
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return ModelGeometry.from_hf_config(model.config, dtype=dtype)


class HFRuntime:
    """Cached prefill for one transformers hybrid model over one ``HybridCache``.

    Runs one request at a time (the anchor recorder is per runtime). Anchors are captured
    when ``anchors`` is True (default: ``cache.config.replay``). ``gate`` decides whether a
    replay plan may be used; without one every replay plan is rejected (falls back to the
    exact plan), because an uncalibrated replay has unknown quality. ``alignment`` is the
    granularity of usable hit lengths; transformers resumes at any token, so it defaults
    to 1 (``config.alignment`` is for paged engines such as vLLM).
    """

    def __init__(self, model: Any, cache: CacheAPI, *, anchors: bool | None = None,
                 gate: ReplayGate | None = None, alignment: int = 1) -> None:
        if alignment <= 0:
            raise ValueError(f"alignment must be positive, got {alignment}")
        self.alignment = alignment
        self.model = model.eval()
        self.cache = cache
        self.config: HybridConfig = cache.config
        self.geometry = cache.geometry
        self.adapter = HFStateAdapter(model, self.geometry)
        self.gate = gate
        self.stepwise_resume = str(getattr(model.config, "model_type", "")) in _STEPWISE_RESUME
        self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.layout: AnchorLayout = anchor_layout(self.geometry, *configured_anchors(self.config))
        want = self.config.replay if anchors is None else anchors
        if want or self.config.replay:
            refuse_replay(model)
        self.recorder = AnchorRecorder(model, self.layout).attach() if want else None

    @classmethod
    def create(cls, model: Any, config: HybridConfig, store: ObjectStore | None = None, *,
               anchors: bool | None = None, gate: ReplayGate | None = None,
               alignment: int = 1, **cache_kwargs: Any) -> HFRuntime:
        """Build the cache for ``model`` (geometry, layout and weights fingerprinted: a
        ``model_id`` in ``cache_kwargs``, else ``geometry.weights.model_identity`` of where
        the model was loaded from and its configuration; embedded over ``store``, default
        the config's tiers, or a ``ServerCache`` when the config names a ``cache_server``)
        and the runtime over it."""
        geometry = geometry_for(model)
        HFStateAdapter(model, geometry)  # refuse a cache the geometry does not describe, first
        anchors_at = anchor_layout(geometry, *configured_anchors(config))
        layout = {"engine": "transformers", **anchors_at.fingerprint()}
        if "model_id" not in cache_kwargs:  # only when asked: the weights' files are stat'ed
            cache_kwargs["model_id"] = model_identity(
                str(getattr(model, "name_or_path", "") or ""),
                getattr(model.config, "_commit_hash", None), model.config)
        cache = assemble.engine_cache(config, geometry, store, layout=layout, **cache_kwargs)
        return cls(model, cache, anchors=anchors, gate=gate, alignment=alignment)

    def close(self) -> None:
        if self.recorder is not None:
            self.recorder.detach()

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def _run(self, ids: torch.Tensor, mc: Any, start: int) -> torch.Tensor:
        """Run tokens ``ids`` ``[n]`` at absolute positions ``[start, start + n)`` into
        model cache ``mc``; return the last position's logits ``[vocab]``."""
        return self.run_tokens(ids, mc, start, all_logits=False)[-1]

    @torch.no_grad()
    def run_tokens(self, ids: torch.Tensor, mc: Any, start: int, all_logits: bool = True) -> torch.Tensor:
        """Run ``ids`` ``[n]`` at absolute positions ``[start, start + n)`` into model cache
        ``mc`` (mutated); return fp32 logits ``[n, vocab]`` (``[1, vocab]``, the last
        position, when ``all_logits`` is False). Anchors are captured when enabled."""
        n = int(ids.numel())
        if n == 0:
            raise ValueError("nothing to run")
        if self.stepwise_resume and start > 0 and n > 1:
            rows = [self.run_tokens(ids[j : j + 1], mc, start + j, all_logits) for j in range(n)]
            return torch.cat(rows) if all_logits else rows[-1]
        device = next(self.model.parameters()).device
        pos = torch.arange(start, start + n, device=device).unsqueeze(0)
        if self.recorder is not None:
            self.recorder.start_at(start)
        kw: dict[str, Any] = {"logits_to_keep": 1} if self._logits_to_keep and not all_logits else {}
        out = model_forward(self.model, ids.to(device).unsqueeze(0), mc, pos, **kw)
        logits: torch.Tensor = out.logits[0].float()
        return logits if all_logits else logits[-1:]

    # ------------------------------------------------------------------ lookup
    def _admits(self, plan: LoadPlan) -> bool:
        """The replay gate: an approximate plan is used only when a calibrated gate admits
        its replay length (without a gate, never)."""
        return self.gate is not None and self.gate.admits(len(plan.anchors) * self.layout.keep)

    def _restore(self, plan: LoadPlan, loaded: LoadResult, info: PrefillInfo) -> Any:
        p = loaded.num_tokens
        ranges = [(o.ref.key.start, o.ref.key.end) for o in plan.kv]
        if loaded.exact:
            return self.adapter.restore(loaded.kv, ranges, p, loaded.state)
        mc = self.adapter.restore(loaded.kv, ranges, p, None)
        t = time.perf_counter()
        hidden, pos = gather_anchors(self.layout, loaded.anchors,
                                     [o.ref.key.start for o in plan.anchors])
        if self.recorder is not None:
            self.recorder.start_at(0, enabled=False)  # replay runs decoder layers: no capture
        self.adapter.set_states(mc, replay_states(self.model, self.adapter, self.layout, hidden, pos))
        info.replayed, info.exact, info.replay_anchors = True, False, int(pos.numel())
        info.seconds["replay"] = time.perf_counter() - t
        return mc

    # ----------------------------------------------------------------- prefill
    @torch.no_grad()
    def prefill(self, input_ids: Sequence[int] | torch.Tensor) -> PrefillResult:
        """Cached prefill of one prompt (token ids, 1-D or ``[1, n]``). Saves KV chunks,
        the checkpoints admission asks for, and anchor pages; returns the next-token
        logits. Store failures only shorten the hit (recomputed); never raises for them."""
        ids = _as_ids(input_ids)
        arr = ids.tolist()
        n = len(arr)
        info = PrefillInfo(prompt_tokens=n)
        t0 = time.perf_counter()
        s = RequestSession(self.cache, arr, alignment=self.alignment, gate=self._admits)
        info.gate_rejected = s.gate_rejected
        if self.recorder is not None:
            self.recorder.reset()
        mc: Any = None
        try:
            if s.plan.hit:
                t = time.perf_counter()
                loaded = s.load()
                info.load_failed = len(loaded.failed)
                info.seconds["load"] = time.perf_counter() - t
                if loaded.num_tokens > 0:
                    mc = self._restore(s.plan, loaded, info)
        finally:
            s.release()
        p = s.hit
        if mc is None:
            mc, p, info.exact = new_model_cache(self.model), 0, True
        info.hit_tokens = p
        info.seconds["restore"] = time.perf_counter() - t0
        # Run the rest, split at the checkpoint positions.
        t = time.perf_counter()
        cuts = s.checkpoints
        states: dict[int, torch.Tensor] = {}
        pos = p
        logits = torch.empty(0)
        for q in [*cuts, n]:
            logits = self._run(ids[pos:q], mc, pos)
            if q < n:
                states[q] = self.adapter.extract_state(mc)
            pos = q
        info.computed_tokens = n - p
        info.checkpoints = tuple(cuts)
        info.seconds["compute"] = time.perf_counter() - t
        info.seconds["ttft"] = time.perf_counter() - t0
        # Saves (off the first-token path; an engine would do them asynchronously).
        t = time.perf_counter()
        pages = self.recorder.pages(n) if self.recorder is not None else []
        info.saved = s.save_prefill(self._kv_of(mc), states, pages)
        info.seconds["save"] = time.perf_counter() - t
        return PrefillResult(logits, mc, info, arr, s)

    def _kv_of(self, mc: Any) -> Callable[[int, int], torch.Tensor] | None:
        """The KV chunk payloads of ``mc`` (None for a model without attention)."""
        if not self.adapter.attention:
            return None
        return lambda a, b: self.adapter.extract_kv(mc, a, b)

    # ------------------------------------------------------------------ decode
    @torch.no_grad()
    def decode(self, result: PrefillResult, num_tokens: int) -> list[int]:
        """Greedy continuation: append ``num_tokens`` argmax tokens, each run through the
        model (so the state covers every returned token). Mutates ``result``."""
        if result.finished:
            raise ValueError("decode after finish")
        out: list[int] = []
        for _ in range(num_tokens):
            tok = int(torch.argmax(result.logits))
            out.append(tok)
            result.logits = self._run(torch.tensor([tok]), result.model_cache, len(result.tokens))
            result.tokens.append(tok)
        result.session.extend(out)
        return out

    def finish(self, result: PrefillResult) -> SaveResult:
        """End the request: save the remaining KV chunks, anchor pages and the final state
        at ``len(result.tokens)`` (kept if admission wants it) through its session."""
        if result.finished:
            raise ValueError("finish called twice")
        result.finished = True
        n = len(result.tokens)
        pages = self.recorder.pages(n) if self.recorder is not None else []
        state = {n: self.adapter.extract_state(result.model_cache)}
        return result.session.finish(self._kv_of(result.model_cache), state, pages)

    def generate(self, input_ids: Sequence[int] | torch.Tensor, num_tokens: int) -> tuple[list[int], PrefillInfo]:
        """prefill + greedy decode of ``num_tokens`` + finish; returns the new tokens."""
        res = self.prefill(input_ids)
        new = self.decode(res, num_tokens)
        self.finish(res)
        return new, res.info


def _as_ids(input_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"batch size 1 only, got input_ids of shape {tuple(ids.shape)}")
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"input_ids must be a non-empty 1-D sequence, got shape {tuple(ids.shape)}")
    return ids.cpu()
