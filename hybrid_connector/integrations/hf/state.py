"""Read and write attention KV and recurrent state in a transformers hybrid model's cache.

transformers 5.x gives every hybrid family (Qwen3.5, Qwen3-Next, Nemotron-H, Bamba, Jamba,
Falcon-H1, GraniteMoeHybrid, LFM2(-MoE), OLMo-hybrid, Zamba2, Kimi Linear) and the pure
state-space LMs (Mamba, Mamba2, FalconMamba: the cache is their ``cache_params``, see
:func:`model_forward`) one cache type, ``DynamicCache``, whose per-layer objects are

* ``DynamicLayer`` (attention): ``keys``/``values`` ``[batch, kv_heads, seq, head_dim]``
  (Kimi Linear's MLA: the latent as keys, the rotary key as values, of other widths);
* ``LinearAttentionLayer`` (GDN, Mamba2, Mamba1): ``conv_states[i]`` ``[batch, channels,
  conv_kernel]`` and ``recurrent_states[i]``, for ``i < number_of_states``; layers without a
  mixer (Nemotron-H MLP/MoE blocks) leave them ``None``;
* ``LinearAttentionAndFullAttentionLayer`` (Falcon-H1's parallel layer, Zamba2's hybrid
  layer: a shared attention block and the layer's own Mamba2 mixer): both.

:class:`HFStateAdapter` discovers that layout once by running one token through a fresh
cache (``probe``), checks that every tensor it holds is the part that the geometry's payload
layout (``hybrid_connector.payload.layout``, the one description of the bytes) says, and then
converts between the model's cache objects and payloads of exactly those layouts:

* **KV chunk** ``[s, e)``: ``layout.kv_layout(geometry, e - s)``: per attention layer, K
  then V, token-major ``[e - s, kv_heads, head_dim]`` (V: ``v_dim``).
* **State checkpoint**: ``layout.state_layout(geometry)``: per recurrent layer (layer order)
  the conv state's last ``kernel - 1`` columns ``[channels, kernel - 1]`` (the oldest column
  transformers keeps is never read by the causal conv of the next step) then the recurrent
  state. Restoring pads the conv state back to the kernel width with a zero column.

The bytes move through ``hybrid_connector/kernels/`` (``hf_pack``): row gathers and scatters, page copies.

A state can only be read where the model stopped: to checkpoint at an intermediate
position p, the runtime splits the prefill at p (run ``[0, p)``, ``extract_state``,
continue). Nothing here mutates a cache except :meth:`restore` (which builds a new one) and
:meth:`set_states` (which writes into the one it is given).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.integrations.hf import pack as hf_pack
from hybrid_connector.payload import layout as parts_of
from hybrid_connector.payload.layout import PayloadLayout, kv_layout, state_layout


@dataclass(frozen=True)
class RecurrentSlot:
    """One (layer, state index) recurrent state as the model's cache holds it."""

    layer: int
    index: int
    conv_shape: tuple[int, ...]  # without batch; last dim is the full kernel width
    conv_dtype: torch.dtype
    rec_shape: tuple[int, ...] | None  # None: conv-only mixer
    rec_dtype: torch.dtype | None

    @property
    def kernel(self) -> int:
        return self.conv_shape[-1]

    @property
    def conv_part(self) -> str:
        """Name of the conv state's part in ``layout.state_layout``."""
        return parts_of.conv_part(self.layer)

    @property
    def rec_part(self) -> str:
        """Name of the recurrent state's part in ``layout.state_layout``."""
        return parts_of.recurrent_part(self.layer)


@dataclass(frozen=True)
class AttentionSlot:
    """One attention layer's cache: ``kv_heads`` heads of K ``head_dim``, V ``v_dim`` wide."""
    layer: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    v_dim: int = 0


# Where transformers keeps the decoder stack: causal LMs under ``model`` (``model.layers``),
# multimodal checkpoint classes (Qwen3.5 / Qwen3.5-MoE ``...ForConditionalGeneration``) under
# ``model.language_model``, pure state-space LMs (Mamba, Mamba2, FalconMamba) under ``backbone``.
_DECODER_PATHS = (("model", "language_model"), ("model",), ("backbone",))


def decoder_base(model: Any) -> torch.nn.Module:
    """The module holding the decoder layers (``layers``) and, where the family has one, the
    rotary embedding (``rotary_emb``): the first of ``model.model.language_model`` (multimodal
    checkpoint classes: their text decoder), ``model.model``, ``model.backbone`` that has
    ``layers``. Raises ValueError naming the class when none has."""
    for path in _DECODER_PATHS:
        base: Any = model
        for name in path:
            base = getattr(base, name, None)
        if base is not None and getattr(base, "layers", None) is not None:
            return base
    raise ValueError(f"{type(model).__name__}: no decoder layers (looked for `model.layers`, "
                     "`model.language_model.layers`, `backbone.layers`); not a supported LM")


def decoder_layers(model: Any) -> Sequence[torch.nn.Module]:
    """The decoder layer modules of a transformers LM (``decoder_base(model).layers``)."""
    layers: Any = decoder_base(model).layers
    return list(layers)


_CACHE_PARAMS: dict[type, bool] = {}


def _takes_cache_params(model: Any) -> bool:
    """Whether ``model.forward`` takes the cache as ``cache_params`` (looked up once per
    class: the runtime calls :func:`model_forward` per decoded token)."""
    cls = type(model)
    if cls not in _CACHE_PARAMS:
        _CACHE_PARAMS[cls] = "cache_params" in inspect.signature(model.forward).parameters
    return _CACHE_PARAMS[cls]


def model_forward(model: Any, ids: torch.Tensor, cache: Any, positions: torch.Tensor,
                  **kw: Any) -> Any:
    """``model(ids)`` (``[1, n]``) into ``cache`` (mutated) at absolute ``positions``
    (``[1, n]``), returning the model's output. Pure state-space LMs (Mamba, Mamba2,
    FalconMamba) take the cache as ``cache_params`` and have no positions; every other
    family takes ``past_key_values`` and ``position_ids``."""
    if _takes_cache_params(model):
        return model(input_ids=ids, cache_params=cache, use_cache=True, **kw)
    return model(input_ids=ids, past_key_values=cache, position_ids=positions, use_cache=True,
                 **kw)


def new_model_cache(model: Any) -> Any:
    """A fresh, empty cache of the model's own type (``DynamicCache(config=...)``)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


class HFStateAdapter:
    """Layout of one model's cache and conversions to/from connector payloads.

    Raises ValueError at construction when the model's cache does not have the layer kinds
    the geometry says (wrong geometry, or a cache class this adapter does not know), or has
    a layer a KV chunk cannot hold: sliding-window attention, indexed (DSA) attention, or K
    and V of different head counts. K and V of different head sizes (multi-head latent
    attention's latent and rotary key) are held when the geometry's ``v_head_dim`` says so.
    """

    def __init__(self, model: Any, geometry: ModelGeometry) -> None:
        self.model = model
        self.geometry = geometry
        self.attention: tuple[AttentionSlot, ...]
        self.recurrent: tuple[RecurrentSlot, ...]
        self._probe()
        att = tuple(s.layer for s in self.attention)
        rec = tuple(sorted({s.layer for s in self.recurrent}))
        if att != geometry.attention_layers or rec != geometry.recurrent_layers:
            raise ValueError(
                f"{type(model).__name__}: cache has attention layers {att} and recurrent layers "
                f"{rec}, geometry says {geometry.attention_layers} / {geometry.recurrent_layers}"
            )
        self.state_layout: PayloadLayout = state_layout(geometry)
        self._check_layout()
        self.num_layers = len(decoder_layers(model))

    # ------------------------------------------------------------------ layout
    def _probe(self) -> None:
        """Run one token through a fresh cache and record what each layer holds."""
        param = next(self.model.parameters())
        cache = new_model_cache(self.model)
        ids = torch.zeros((1, 1), dtype=torch.long, device=param.device)
        with torch.no_grad():
            model_forward(self.model, ids, cache, torch.zeros_like(ids))
        att: list[AttentionSlot] = []
        rec: list[RecurrentSlot] = []
        for i, layer in enumerate(cache.layers):
            self._refuse_layer(i, layer)
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if isinstance(keys, torch.Tensor) and keys.numel() > 0:
                v_dim = int(values.shape[3]) if isinstance(values, torch.Tensor) else 0
                att.append(AttentionSlot(i, int(keys.shape[1]), int(keys.shape[3]), keys.dtype,
                                         v_dim))
            convs = getattr(layer, "conv_states", None)
            if isinstance(convs, dict):
                for j in sorted(convs):
                    c = convs[j]
                    if c is None:
                        continue
                    r = layer.recurrent_states.get(j)
                    rec.append(RecurrentSlot(
                        i, j, tuple(c.shape[1:]), c.dtype,
                        tuple(r.shape[1:]) if r is not None else None,
                        r.dtype if r is not None else None,
                    ))
        self.attention, self.recurrent = tuple(att), tuple(rec)

    def _where(self) -> str:  # model class and architecture, for errors
        return f"{type(self.model).__name__} ({getattr(self.model.config, 'model_type', '?')})"

    def _refuse_layer(self, i: int, layer: Any) -> None:
        """ValueError for a probed cache layer whose contents a KV chunk cannot hold, naming
        the model, architecture, layer and reason (refused here, at construction, rather
        than failing in :func:`pack` or losing data on the first save)."""
        where = self._where()
        if getattr(layer, "is_sliding", False):
            raise ValueError(f"{where}: layer {i} is sliding-window attention, which the "
                             "adapter does not support")
        if hasattr(layer, "indexer_keys"):  # transformers' DynamicIndexedLayer (DSA)
            raise ValueError(f"{where}: layer {i} is indexed attention (sparse attention with a "
                             "DSA indexer): its cache also holds indexer keys, which KV chunks "
                             "neither save nor restore")
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.shape[1] != v.shape[1]:
            raise ValueError(f"{where}: layer {i} caches {k.shape[1]} K heads and {v.shape[1]} V "
                             "heads: a KV chunk holds as many V heads as K heads")

    def _check_layout(self) -> None:
        """ValueError unless every tensor the cache holds is the part the geometry's layout
        says (shape without batch, dtype; the conv state ``kernel - 1`` wide), naming the
        layer: the adapter packs exactly ``layout.kv_layout`` / ``layout.state_layout``."""
        where = self._where()
        kv = kv_layout(self.geometry, 1)
        for a in self.attention:
            names = parts_of.kv_parts(a.layer)
            for name, dim, part_name in zip("kv", (a.head_dim, a.v_dim), names, strict=True):
                part = kv.part(part_name)
                have = ((1, a.kv_heads, dim), a.dtype)
                if have != (part.shape, part.torch_dtype):
                    raise ValueError(
                        f"{where}: layer {a.layer} caches {name.upper()} of {a.kv_heads} x {dim} "
                        f"{a.dtype} per token, the geometry's layout says {part.shape[1]} x "
                        f"{part.shape[2]} {part.torch_dtype}"
                        + (" (K and V head sizes differ: give the geometry's attention a "
                           "v_head_dim)" if a.v_dim != a.head_dim else ""))
        seen: set[int] = set()
        for s in self.recurrent:
            if s.layer in seen:
                raise ValueError(f"{where}: layer {s.layer} caches more than one recurrent state "
                                 f"(state index {s.index}); the geometry's layout has one per layer")
            seen.add(s.layer)
            conv = self.state_layout.part(s.conv_part)
            want = (conv.shape, conv.torch_dtype)
            if ((*s.conv_shape[:-1], s.kernel - 1), s.conv_dtype) != want:
                raise ValueError(f"{where}: layer {s.layer} conv state {s.conv_shape} {s.conv_dtype} "
                                 f"keeps {(*s.conv_shape[:-1], s.kernel - 1)}, the geometry's "
                                 f"layout says {want[0]} {want[1]}")
            rec = (self.state_layout.part(s.rec_part) if s.rec_part in self.state_layout.names
                   else None)
            have_rec = None if s.rec_shape is None else (s.rec_shape, s.rec_dtype)
            if have_rec != (None if rec is None else (rec.shape, rec.torch_dtype)):
                raise ValueError(f"{where}: layer {s.layer} recurrent state {have_rec}, the "
                                 f"geometry's layout says "
                                 f"{None if rec is None else (rec.shape, rec.torch_dtype)}")

    def state_nbytes(self) -> int:
        return self.state_layout.nbytes

    def kv_nbytes(self, num_tokens: int) -> int:
        return kv_layout(self.geometry, num_tokens).nbytes

    # ---------------------------------------------------------------- extract
    def kv_length(self, cache: Any) -> int:
        """Tokens of KV the cache holds (0 for a cache without attention layers)."""
        if not self.attention:
            return 0
        keys = cache.layers[self.attention[0].layer].keys
        return 0 if keys is None or keys.numel() == 0 else int(keys.shape[-2])

    def extract_kv(self, cache: Any, start: int, end: int) -> torch.Tensor:
        """The KV chunk of tokens ``[start, end)`` of every attention layer (batch row 0), a
        payload of ``kv_layout(geometry, end - start)`` on the cache's device, written by the kernels'
        row gather. Raises ValueError when the cache does not hold those tokens."""
        held = self.kv_length(cache)
        if not 0 <= start < end <= held:
            raise ValueError(f"extract_kv: [{start}, {end}) is outside the {held} cached tokens")
        layout = kv_layout(self.geometry, end - start)
        payload, views = layout.allocate(cache.layers[self.attention[0].layer].keys.device)
        for a in self.attention:
            layer = cache.layers[a.layer]
            k, v = parts_of.kv_parts(a.layer)
            hf_pack.gather_kv(layer.keys, start, views[k])
            hf_pack.gather_kv(layer.values, start, views[v])
        return layout.commit(payload, views)

    def extract_state(self, cache: Any) -> torch.Tensor:
        """The state the cache holds now (after the last token it ran), a payload of
        ``state_layout`` on the cache's device: conv columns by the kernels' row gather, all
        recurrent states in one page copy."""
        layout = self.state_layout
        device = None
        convs: list[tuple[torch.Tensor, str]] = []
        recs: list[tuple[torch.Tensor, str]] = []
        for s in self.recurrent:
            layer = cache.layers[s.layer]
            conv = layer.conv_states[s.index]
            if conv is None:
                raise ValueError(f"extract_state: layer {s.layer} has no state yet (nothing ran)")
            device = conv.device
            convs.append((conv, s.conv_part))
            if s.rec_shape is not None:
                recs.append((layer.recurrent_states[s.index][0].contiguous(), s.rec_part))
        payload, views = layout.allocate(device)
        for conv, name in convs:
            hf_pack.gather_conv(conv, views[name])
        hf_pack.copy_states([r for r, _ in recs], [views[n] for _, n in recs])
        return layout.commit(payload, views)

    def layer_states(self, cache: Any, layers: Sequence[int]) -> dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]]:
        """The raw (full-width conv, recurrent) tensors of ``layers`` in ``cache`` (views)."""
        want = set(layers)
        out: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]] = {}
        for s in self.recurrent:
            if s.layer in want:
                layer = cache.layers[s.layer]
                out[(s.layer, s.index)] = (layer.conv_states[s.index],
                                           layer.recurrent_states.get(s.index))
        return out

    # ---------------------------------------------------------------- restore
    def restore(self, kv_payloads: Sequence[torch.Tensor], kv_ranges: Sequence[tuple[int, int]],
                num_tokens: int, state: torch.Tensor | None) -> Any:
        """A new model cache holding KV ``[0, num_tokens)`` and, when given, the packed
        ``state`` (the state at ``num_tokens``). ``kv_ranges`` are the payloads' token ranges,
        contiguous from 0; the last may extend past ``num_tokens`` (it is cut). Without a
        state the recurrent layers stay empty: the caller must :meth:`set_states` (replay)
        before running the model. Raises ValueError for payloads that do not fit."""
        cache = new_model_cache(self.model)
        device = next(self.model.parameters()).device
        if self.attention and num_tokens > 0:
            bufs, joint = hf_pack.kv_buffers([(a.kv_heads, dim, a.dtype) for a in self.attention
                                              for dim in (a.head_dim, a.v_dim)], num_tokens, device)
            pos = 0
            for payload, (s, e) in zip(kv_payloads, kv_ranges, strict=True):
                if s != pos:
                    raise ValueError(f"restore: KV chunks are not contiguous at {pos} (got [{s}, {e}))")
                parts = kv_layout(self.geometry, e - s).unpack(payload.to(device))
                hf_pack.scatter_kv_chunk(list(parts.values()), bufs, joint, s, min(e, num_tokens) - s)
                pos = e
                if pos >= num_tokens:
                    break
            if pos < num_tokens:
                raise ValueError(f"restore: KV reaches {pos} tokens, need {num_tokens}")
            for j, a in enumerate(self.attention):
                hf_pack.adopt_kv(cache.layers[a.layer], bufs[2 * j], bufs[2 * j + 1])
        if state is not None:
            self.set_states(cache, self.unpack_state(state))
        return cache

    def unpack_state(self, state: torch.Tensor) -> dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]]:
        """Packed state -> {(layer, index): (conv [channels, kernel-1], recurrent)} (views).
        Raises ValueError, naming the part, for a payload of another layout."""
        parts = self.state_layout.unpack(state)
        return {(s.layer, s.index): (parts[s.conv_part],
                                     parts[s.rec_part] if s.rec_shape is not None else None)
                for s in self.recurrent}

    def set_states(self, cache: Any,
                   states: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]]) -> None:
        """Write recurrent states into ``cache``'s own state tensors (allocated through the
        layer's update methods the first time) and mark the layer as having a previous
        state. Conv states (with or without a batch dim of 1) may be given at the kernel width
        or at ``kernel - 1`` (then zero-padded on the left); values are cast to the cache's dtypes. The bytes move
        through the kernels (conv rows scatter, one page copy for the recurrent states).
        Mutates ``cache``."""
        device = next(self.model.parameters()).device
        src: list[torch.Tensor] = []
        dst: list[torch.Tensor] = []
        for s in self.recurrent:
            if (s.layer, s.index) not in states:
                continue
            conv, rec = states[(s.layer, s.index)]
            rows = math.prod(s.conv_shape[:-1])
            if conv.numel() != rows * conv.shape[-1] or conv.shape[-1] not in (s.kernel - 1, s.kernel):
                raise ValueError(f"set_states: layer {s.layer} conv {tuple(conv.shape)} != {s.conv_shape}")
            layer = cache.layers[s.layer]
            if not layer.is_conv_states_initialized[s.index]:
                layer.update_conv_state(torch.zeros((1, *s.conv_shape), dtype=s.conv_dtype, device=device),
                                        state_idx=s.index, conv_kernel_size=s.kernel)
            hf_pack.scatter_conv(conv.to(device), layer.conv_states[s.index])
            layer.has_previous_state[s.index] = True
            if rec is not None and s.rec_shape is not None and s.rec_dtype is not None:
                if not layer.is_recurrent_states_initialized[s.index]:
                    layer.update_recurrent_state(
                        torch.zeros((1, *s.rec_shape), dtype=s.rec_dtype, device=device), state_idx=s.index)
                r = rec.to(device=device, dtype=s.rec_dtype).reshape(s.rec_shape).contiguous()
                d = layer.recurrent_states[s.index][0]
                if r.data_ptr() != d.data_ptr():  # a cache's own state: nothing to copy
                    src.append(r)
                    dst.append(d)
        hf_pack.copy_states(src, dst)
