"""What each cached object holds, per tensor-parallel rank: the one description of the bytes.

The cache stores three kinds of payloads (KV chunks, state checkpoints, anchor blocks: the
table in ``docs/index.md``). This module says, from the
:class:`~hybrid_connector.geometry.model.ModelGeometry` alone, exactly which bytes each one
holds, so every integration (transformers, vLLM, SGLang) packs the same bytes and the
cache's size check (the geometry's ``kv_bytes_per_token``, ``state_bytes`` and
``geometry.anchors.anchor_block_bytes``) holds by construction: the shapes come from
``hybrid_connector.geometry.rank_dims``, the numbers the geometry's byte figures multiply.

* **KV chunk** of ``n`` tokens (:func:`kv_layout`): per attention layer in layer order, K
  then V, K ``[n, kv_heads_per_rank, head_dim]`` and V ``[n, kv_heads_per_rank, v_dim]`` in
  ``geometry.dtype`` (token-major: the row of token t, head h is ``t * heads + h``). Parts
  ``layers.{i}.k`` / ``layers.{i}.v``. Empty for a model without attention layers.
* **State checkpoint** (:func:`state_layout`): per recurrent layer in layer order, its conv
  state ``[channels_per_rank, conv_kernel - 1]`` in ``geometry.dtype`` (the last
  ``kernel - 1`` conv inputs, oldest first) then its recurrent state in
  ``geometry.state_dtype`` (none for a short conv). Parts ``layers.{i}.conv_state`` /
  ``layers.{i}.recurrent_state``.
* **Anchor block** of one page (:func:`anchor_layout`): per recurrent group in order, the
  hidden states entering the group's first layer at the page's last
  ``geometry.anchors.anchor_keep`` positions, ``[keep, hidden_size]`` in ``geometry.dtype``.
  Parts ``group.{first layer of the group}``.

How parts are packed (offsets, pack/unpack) is :class:`~hybrid_connector.payload.parts.PayloadLayout`;
moving a KV chunk between paged engine buffers and a payload is
:mod:`hybrid_connector.payload.paged`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry import rank_dims
from hybrid_connector.geometry.anchors import anchor_keep
from hybrid_connector.geometry.layers import TensorSpec
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.payload.parts import Part, PayloadLayout, torch_dtype

__all__ = [
    "AnchorLayout",
    "Part",
    "PayloadLayout",
    "anchor_layout",
    "conv_part",
    "kv_layout",
    "kv_layout_of",
    "kv_parts",
    "recurrent_part",
    "state_layout",
    "torch_dtype",
]


def kv_parts(layer: int) -> tuple[str, str]:
    """The names of attention layer ``layer``'s K and V parts in a KV chunk."""
    return f"layers.{layer}.k", f"layers.{layer}.v"


def conv_part(layer: int) -> str:
    """The name of recurrent layer ``layer``'s conv state part in a state checkpoint."""
    return f"layers.{layer}.conv_state"


def recurrent_part(layer: int) -> str:
    """The name of recurrent layer ``layer``'s recurrent state part in a state checkpoint."""
    return f"layers.{layer}.recurrent_state"


def _kv_specs(g: ModelGeometry, num_tokens: int) -> list[TensorSpec]:
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    if not g.attention_layers:
        return []
    assert g.attention is not None
    heads = rank_dims.kv_heads_per_rank(g)
    k_shape = (num_tokens, heads, g.attention.head_dim)
    v_shape = (num_tokens, heads, g.attention.v_dim)
    out: list[TensorSpec] = []
    for i in g.attention_layers:
        k, v = kv_parts(i)
        out.append(TensorSpec(k, k_shape, g.dtype))
        out.append(TensorSpec(v, v_shape, g.dtype))
    return out


def _state_specs(g: ModelGeometry) -> list[TensorSpec]:
    out: list[TensorSpec] = []
    for layer in g.layers:
        shapes = rank_dims.state_shapes(g, layer)
        if shapes is None:
            continue
        out.append(TensorSpec(conv_part(layer.index), shapes.conv, g.dtype))
        if shapes.recurrent is not None:
            out.append(TensorSpec(recurrent_part(layer.index), shapes.recurrent, g.state_dtype))
    return out


# --------------------------------------------------------------------------------------------
# the three layouts of a geometry


@functools.lru_cache(maxsize=512)
def kv_layout(geometry: ModelGeometry, num_tokens: int) -> PayloadLayout:
    """The KV chunk of ``num_tokens`` tokens on one rank (see the module docstring). Empty
    (no parts, 0 bytes) for a model without attention layers. Raises ValueError for a
    negative ``num_tokens``."""
    return PayloadLayout.of(ObjectKind.KV, _kv_specs(geometry, num_tokens))


def kv_layout_of(geometry: ModelGeometry, payload: torch.Tensor) -> PayloadLayout:
    """The KV layout of a KV chunk ``payload`` whose token count only its size tells (its
    bytes over ``geometry.kv_bytes_per_token()``). Raises ValueError when the size is not
    whole tokens."""
    n = payload.numel() * payload.element_size()
    per = geometry.kv_bytes_per_token()
    if not per or n % per:
        raise ValueError(f"a KV payload of {n} B is not whole tokens of {per} B")
    return kv_layout(geometry, n // per)


@functools.lru_cache(maxsize=64)
def state_layout(geometry: ModelGeometry) -> PayloadLayout:
    """One state checkpoint on one rank (see the module docstring)."""
    return PayloadLayout.of(ObjectKind.STATE, _state_specs(geometry))


@dataclass(frozen=True)
class AnchorLayout:
    """Which positions of a page an anchor block keeps, and the block's payload layout.

    In each page ``[s, s + page)`` the block keeps the **last** ``keep`` positions
    ``[s + page - keep, s + page)``; per recurrent group (``groups``, each a run of layer
    indices) one ``[keep, hidden]`` part of ``dtype``. Build it with :func:`anchor_layout`.
    """

    page: int
    keep: int
    groups: tuple[tuple[int, ...], ...]
    hidden: int
    dtype: str
    payload: PayloadLayout

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of one block (equals ``geometry.anchors.anchor_block_bytes``)."""
        return self.payload.nbytes

    def positions(self, page_start: int) -> range:
        """Absolute token positions kept for the page starting at ``page_start``."""
        return range(page_start + self.page - self.keep, page_start + self.page)

    def pack(self, per_group: Sequence[torch.Tensor]) -> torch.Tensor:
        """One ``[keep, hidden]`` tensor per group -> payload (ValueError naming the group)."""
        return self.payload.pack(per_group)

    def unpack(self, payload: torch.Tensor) -> list[torch.Tensor]:
        """Payload -> one ``[keep, hidden]`` tensor per group (ValueError if it does not fit)."""
        return list(self.payload.unpack(payload).values())

    def fingerprint(self) -> dict[str, object]:
        return {"anchor_page": self.page, "anchor_keep": self.keep}


@functools.lru_cache(maxsize=64)
def anchor_layout(geometry: ModelGeometry, page: int, density: float) -> AnchorLayout:
    """The anchor block of ``geometry`` for pages of ``page`` tokens at density ``density``
    (``keep = geometry.anchors.anchor_keep``, the one rule). Raises ValueError for a bad page
    or density, or a model without recurrent groups."""
    groups = geometry.recurrent_groups()
    if not groups:
        raise ValueError(f"{geometry.name}: anchors need at least one recurrent group")
    keep = anchor_keep(geometry, page, density)
    specs = [TensorSpec(f"group.{g[0]}", (keep, geometry.hidden_size), geometry.dtype)
             for g in groups]
    return AnchorLayout(page, keep, groups, geometry.hidden_size, geometry.dtype,
                        PayloadLayout.of(ObjectKind.ANCHOR, specs))
