"""Read and write attention KV and recurrent state in a transformers hybrid model's cache.

transformers 5.x gives every hybrid family (Qwen3.5, Qwen3-Next, Nemotron-H, Bamba, Jamba,
Falcon-H1, GraniteMoeHybrid) one cache type, ``DynamicCache``, whose per-layer objects are

* ``DynamicLayer`` (attention): ``keys``/``values`` ``[batch, kv_heads, seq, head_dim]``;
* ``LinearAttentionLayer`` (GDN, Mamba2, Mamba1): ``conv_states[i]`` ``[batch, channels,
  conv_kernel]`` and ``recurrent_states[i]``, for ``i < number_of_states``; layers without a
  mixer (Nemotron-H MLP/MoE blocks) leave them ``None``;
* ``LinearAttentionAndFullAttentionLayer`` (Falcon-H1's parallel layer): both.

:class:`HFStateAdapter` discovers that layout once by running one token through a fresh
cache (``probe``), checks it against the :class:`ModelGeometry`, and then converts between
the model's cache objects and the connector's payloads:

* **KV chunk** ``[s, e)``: per attention layer (layer order), K then V, each
  ``[e - s, kv_heads, head_dim]`` (the geometry's ``kv_layout`` order), packed into one 1-D
  tensor.
* **State checkpoint**: per recurrent layer (layer order) and state index, the conv state's
  last ``kernel - 1`` columns ``[channels, kernel - 1]`` (model.py's convention: the oldest
  column transformers keeps is never read by the causal conv of the next step) then the
  recurrent state, packed into one 1-D tensor. Restoring pads the conv state back to the
  kernel width with a zero column.

A state can only be read where the model stopped: to checkpoint at an intermediate
position p, the runtime splits the prefill at p (run ``[0, p)``, ``extract_state``,
continue). Nothing here mutates a cache except :meth:`restore` (which builds a new one) and
:meth:`set_states` (which writes into the one it is given).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hybrid_connector.integrations.hf_pack import PartSpec, pack, payload_nbytes, unpack
from hybrid_connector.model import ModelGeometry


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


@dataclass(frozen=True)
class AttentionSlot:
    layer: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype


def decoder_layers(model: Any) -> Sequence[torch.nn.Module]:
    """The decoder layer modules of a transformers causal LM (``model.model.layers``)."""
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no `model.layers`; not a supported causal LM")
    return list(layers)


def new_model_cache(model: Any) -> Any:
    """A fresh, empty cache of the model's own type (``DynamicCache(config=...)``)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


class HFStateAdapter:
    """Layout of one model's cache and conversions to/from connector payloads.

    Raises ValueError at construction when the model's cache does not have the layer kinds
    the geometry says (wrong geometry, or a cache class this adapter does not know), or has
    a layer a KV chunk cannot hold: sliding-window attention, indexed (DSA) attention, or K
    and V of different head shapes (multi-head latent attention).
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
        self.state_specs = self._state_specs()
        self.num_layers = len(decoder_layers(model))

    # ------------------------------------------------------------------ layout
    def _probe(self) -> None:
        """Run one token through a fresh cache and record what each layer holds."""
        param = next(self.model.parameters())
        cache = new_model_cache(self.model)
        ids = torch.zeros((1, 1), dtype=torch.long, device=param.device)
        with torch.no_grad():
            self.model(input_ids=ids, past_key_values=cache, use_cache=True,
                       position_ids=torch.zeros_like(ids))
        att: list[AttentionSlot] = []
        rec: list[RecurrentSlot] = []
        for i, layer in enumerate(cache.layers):
            self._refuse_layer(i, layer)
            keys = getattr(layer, "keys", None)
            if isinstance(keys, torch.Tensor) and keys.numel() > 0:
                att.append(AttentionSlot(i, int(keys.shape[1]), int(keys.shape[3]), keys.dtype))
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

    def _refuse_layer(self, i: int, layer: Any) -> None:
        """ValueError for a probed cache layer whose contents a KV chunk cannot hold, naming
        the model, architecture, layer and reason (refused here, at construction, rather
        than failing in :func:`pack` or losing data on the first save)."""
        where = f"{type(self.model).__name__} ({getattr(self.model.config, 'model_type', '?')})"
        if getattr(layer, "is_sliding", False):
            raise ValueError(f"{where}: layer {i} is sliding-window attention, which the "
                             "adapter does not support")
        if hasattr(layer, "indexer_keys"):  # transformers' DynamicIndexedLayer (DSA)
            raise ValueError(f"{where}: layer {i} is indexed attention (sparse attention with a "
                             "DSA indexer): its cache also holds indexer keys, which KV chunks "
                             "neither save nor restore")
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if (isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and keys.dim() == 4
                and values.dim() == 4 and keys.shape[1::2] != values.shape[1::2]):
            raise ValueError(
                f"{where}: layer {i} caches K of {keys.shape[1]} x {keys.shape[3]} and V of "
                f"{values.shape[1]} x {values.shape[3]} (heads x head size) per token: K and V "
                "head sizes differ (e.g. multi-head latent attention), and a KV chunk holds "
                "one head shape for both")

    def kv_specs(self, num_tokens: int) -> list[PartSpec]:
        out = []
        for a in self.attention:
            shape = (num_tokens, a.kv_heads, a.head_dim)
            out.append(PartSpec(f"layers.{a.layer}.k", shape, a.dtype))
            out.append(PartSpec(f"layers.{a.layer}.v", shape, a.dtype))
        return out

    def _state_specs(self) -> list[PartSpec]:
        out = []
        for s in self.recurrent:
            conv = (*s.conv_shape[:-1], s.kernel - 1)
            out.append(PartSpec(f"layers.{s.layer}.{s.index}.conv_state", conv, s.conv_dtype))
            if s.rec_shape is not None and s.rec_dtype is not None:
                out.append(PartSpec(f"layers.{s.layer}.{s.index}.recurrent_state",
                                    s.rec_shape, s.rec_dtype))
        return out

    def state_nbytes(self) -> int:
        return payload_nbytes(self.state_specs)

    def kv_nbytes(self, num_tokens: int) -> int:
        return payload_nbytes(self.kv_specs(num_tokens))

    # ---------------------------------------------------------------- extract
    def kv_length(self, cache: Any) -> int:
        """Tokens of KV the cache holds (0 for a cache without attention layers)."""
        if not self.attention:
            return 0
        keys = cache.layers[self.attention[0].layer].keys
        return 0 if keys is None or keys.numel() == 0 else int(keys.shape[-2])

    def extract_kv(self, cache: Any, start: int, end: int) -> torch.Tensor:
        """Pack the KV of tokens ``[start, end)`` of every attention layer (batch row 0).
        Raises ValueError when the cache does not hold those tokens."""
        held = self.kv_length(cache)
        if not 0 <= start < end <= held:
            raise ValueError(f"extract_kv: [{start}, {end}) is outside the {held} cached tokens")
        parts = []
        for a in self.attention:
            layer = cache.layers[a.layer]
            parts.append(layer.keys[0, :, start:end].transpose(0, 1))
            parts.append(layer.values[0, :, start:end].transpose(0, 1))
        return pack(parts, self.kv_specs(end - start))

    def extract_state(self, cache: Any) -> torch.Tensor:
        """Pack the recurrent state the cache holds now (after the last token it ran)."""
        parts = []
        for s in self.recurrent:
            layer = cache.layers[s.layer]
            conv = layer.conv_states[s.index]
            if conv is None:
                raise ValueError(f"extract_state: layer {s.layer} has no state yet (nothing ran)")
            parts.append(conv[0, ..., -(s.kernel - 1):])
            if s.rec_shape is not None:
                parts.append(layer.recurrent_states[s.index][0])
        return pack(parts, self.state_specs)

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
            pos = 0
            per_layer: list[list[torch.Tensor]] = [[] for _ in range(2 * len(self.attention))]
            for payload, (s, e) in zip(kv_payloads, kv_ranges, strict=True):
                if s != pos:
                    raise ValueError(f"restore: KV chunks are not contiguous at {pos} (got [{s}, {e}))")
                for j, t in enumerate(unpack(payload, self.kv_specs(e - s))):
                    per_layer[j].append(t)
                pos = e
                if pos >= num_tokens:
                    break
            if pos < num_tokens:
                raise ValueError(f"restore: KV reaches {pos} tokens, need {num_tokens}")
            for j, a in enumerate(self.attention):
                k = torch.cat(per_layer[2 * j])[:num_tokens].transpose(0, 1).unsqueeze(0)
                v = torch.cat(per_layer[2 * j + 1])[:num_tokens].transpose(0, 1).unsqueeze(0)
                cache.layers[a.layer].update(k.to(device).contiguous(), v.to(device).contiguous())
        if state is not None:
            self.set_states(cache, self.unpack_state(state))
        return cache

    def unpack_state(self, state: torch.Tensor) -> dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]]:
        """Packed state -> {(layer, index): (conv [channels, kernel-1], recurrent)}."""
        parts = iter(unpack(state, self.state_specs))
        out: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]] = {}
        for s in self.recurrent:
            conv = next(parts)
            rec = next(parts) if s.rec_shape is not None else None
            out[(s.layer, s.index)] = (conv, rec)
        return out

    def set_states(self, cache: Any,
                   states: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]]) -> None:
        """Write recurrent states into ``cache`` through the layer's own update methods, so
        the layer is marked as having a previous state. Conv states may be given at the
        kernel width or at ``kernel - 1`` (zero-padded on the left). Mutates ``cache``."""
        device = next(self.model.parameters()).device
        for s in self.recurrent:
            if (s.layer, s.index) not in states:
                continue
            conv, rec = states[(s.layer, s.index)]
            conv = conv.to(device=device, dtype=s.conv_dtype)
            if conv.shape[-1] == s.kernel - 1:
                conv = torch.nn.functional.pad(conv, (1, 0))
            if tuple(conv.shape[-len(s.conv_shape):]) != s.conv_shape:
                raise ValueError(f"set_states: layer {s.layer} conv {tuple(conv.shape)} != {s.conv_shape}")
            layer = cache.layers[s.layer]
            conv_b = conv.reshape(1, *s.conv_shape).clone()
            if layer.is_conv_states_initialized[s.index]:
                layer.conv_states[s.index].copy_(conv_b)
                layer.has_previous_state[s.index] = True
            else:
                layer.update_conv_state(conv_b, state_idx=s.index, conv_kernel_size=s.kernel)
            if rec is not None and s.rec_shape is not None:
                layer.update_recurrent_state(
                    rec.to(device=device, dtype=s.rec_dtype).reshape(1, *s.rec_shape).clone(),
                    state_idx=s.index)
