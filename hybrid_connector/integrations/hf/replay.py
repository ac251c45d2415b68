"""Suffix replay on a transformers model: rebuild recurrent state at p from anchors.

The state of a decaying recurrence (Mamba2, Gated DeltaNet, Mamba1) at p depends mostly on
the last inputs, so ``S_p ~= f(h_{p-k+1}, ..., h_p)`` from a zero state (SuffixReplay,
eq. 2). Anchors hold ``h``, the hidden states entering each recurrent group. To rebuild a
group's states, :func:`replay_states` runs **only that group's decoder layers** (its
recurrent layers and the MLP/MoE/norm parts between them, never an attention layer that
separates groups) on the group's last k anchors, from a fresh zero state, and reads the
states those layers leave behind. Groups are independent, so errors do not propagate from
one group to the next. Anchors are sparse (see ``hf_anchors``): replay feeds the kept
positions in order and skips the gaps, which is part of the approximation.

This is approximate: every hit built this way is labelled ``exact=False``, and only a
replay that :class:`hybrid_connector.runtime.suffix_replay.ReplayGate` admits may be served.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from hybrid_connector.integrations.hf.anchors import AnchorLayout
from hybrid_connector.integrations.hf.state import (
    HFStateAdapter,
    decoder_base,
    decoder_layers,
    new_model_cache,
)

StateMap = dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]]


def gather_anchors(layout: AnchorLayout, payloads: Sequence[torch.Tensor],
                   page_starts: Sequence[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Concatenate anchor blocks (in page order) -> one ``[n, hidden]`` tensor per group and
    the ``[n]`` absolute positions they were taken at."""
    if len(payloads) != len(page_starts) or not payloads:
        raise ValueError(f"gather_anchors: {len(payloads)} payloads for {len(page_starts)} pages")
    per_group: list[list[torch.Tensor]] = [[] for _ in layout.groups]
    pos: list[int] = []
    for payload, start in zip(payloads, page_starts, strict=True):
        for gi, t in enumerate(layout.unpack(payload)):
            per_group[gi].append(t)
        pos.extend(layout.positions(start))
    return [torch.cat(ts) for ts in per_group], torch.tensor(pos, dtype=torch.long)


# Families whose layers read more than the hidden state an anchor holds, so suffix replay
# cannot rebuild their states: Zamba2's shared attention blocks also take the token
# embeddings (``original_hidden_states``). Exact checkpoints work; replay is refused.
NO_REPLAY: dict[str, str] = {
    "zamba2": "its shared attention blocks read the token embeddings beside the hidden state, "
              "and anchors hold only the hidden state",
}


def refuse_replay(model: Any) -> None:
    """ValueError, naming the architecture and why, for a family suffix replay cannot
    rebuild the states of (:data:`NO_REPLAY`)."""
    mt = str(getattr(model.config, "model_type", ""))
    if mt in NO_REPLAY:
        raise ValueError(f"{mt}: suffix replay (config.replay, anchors) is not supported: "
                         f"{NO_REPLAY[mt]}; use exact checkpoints (replay off)")


@torch.no_grad()
def replay_states(model: Any, adapter: HFStateAdapter, layout: AnchorLayout,
                  hidden: Sequence[torch.Tensor], positions: torch.Tensor,
                  k: int | None = None) -> StateMap:
    """Rebuild the states of every recurrent layer from anchors.

    ``hidden[g]`` is ``[n, hidden]`` for group g, ``positions`` their absolute positions;
    only the last ``k`` anchors are replayed (all when None). Returns
    ``{(layer, index): (conv [.., kernel], recurrent)}`` for :meth:`HFStateAdapter.set_states`.
    Does not touch any existing cache (replay runs in a scratch cache).
    """
    n = int(positions.numel())
    if k is not None:
        if k <= 0:
            raise ValueError(f"replay needs k > 0 anchors, got {k}")
        n = min(n, k)
    layers = decoder_layers(model)
    device = next(model.parameters()).device
    pos = positions[-n:].to(device).unsqueeze(0)
    scratch = new_model_cache(model)
    kinds = adapter.geometry.layers
    rotary = getattr(decoder_base(model), "rotary_emb", None)
    out: StateMap = {}
    for gi, group in enumerate(layout.groups):
        h = hidden[gi][-n:].to(device).unsqueeze(0)
        span = range(group[0], group[-1] + 1)
        pe = None
        if rotary is not None and any(kinds[i].mixer.has_kv for i in span):
            pe = rotary(h, position_ids=pos)  # Falcon-H1: attention runs beside the mixer
        for i in span:
            if "cache_params" in inspect.signature(layers[i].forward).parameters:
                res = layers[i](h, cache_params=scratch)  # Mamba, Mamba2, FalconMamba blocks
            else:
                res = layers[i](h, attention_mask=None, position_ids=pos, past_key_values=scratch,
                                use_cache=True, position_embeddings=pe)
            h = res[0] if isinstance(res, tuple) else res
        out.update(adapter.layer_states(scratch, group))
    return out
