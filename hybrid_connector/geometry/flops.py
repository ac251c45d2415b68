"""FLOP formulas: per layer family (corrected: GQA, GDN, MoE) and the Marconi reference
simulator's own formulas (quirks included), used by ``ModelGeometry.flops_saved`` and the
eviction accounting. 2 FLOPs per multiply-add; L tokens at positions ``[P, P + L)``.
"""

from __future__ import annotations

from hybrid_connector.geometry.layers import (
    AttentionDims,
    GDNDims,
    Mamba1Dims,
    Mamba2Dims,
    MLADims,
    MLPDims,
    MoEDims,
    ShortConvDims,
)

# --------------------------------------------------------------------------------------------
# per-family FLOP formulas (L tokens at absolute positions [P, P + L), 2 FLOPs per MAC)


def _causal_context_sum(num_tokens: int, prefix_tokens: int) -> int:
    """Sum over query positions t in [P, P+L) of the number of keys attended, t + 1."""
    n, p = num_tokens, prefix_tokens
    return n * p + n * (n + 1) // 2


def attention_layer_flops(a: AttentionDims, d: int, num_tokens: int, prefix_tokens: int) -> float:
    """One attention layer: q (x2 with an output gate), k, v, o projections, plus QK^T and
    PV, each ``2 * n_heads * head_dim`` FLOPs per (query, key) pair over the causal context.
    Rotary, softmax and norms are not counted."""
    n = num_tokens
    q_out = a.num_heads * a.head_dim * (2 if a.output_gate else 1)
    kv_out = a.num_kv_heads * (a.head_dim + a.v_dim)
    proj = 2 * n * d * (q_out + kv_out) + 2 * n * a.num_heads * a.v_dim * d
    scores = 2 * a.num_heads * (a.head_dim + a.v_dim) * _causal_context_sum(n, prefix_tokens)
    return float(proj + scores)


def mla_layer_flops(m: MLADims, num_heads: int, d: int, num_tokens: int,
                    prefix_tokens: int) -> float:
    """One multi-head latent attention layer: q (through ``q_lora_rank`` when set), the
    latent + rope key projection, the per-head expansion of the latent to k_nope and v (for
    the new tokens: an engine caches the latent and expands it once per token), QK^T over
    ``qk_nope + qk_rope`` and PV over ``v_head_dim`` per (query, key) pair, and o_proj."""
    n, h = num_tokens, num_heads
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    q = 2 * n * (d * m.q_lora_rank + m.q_lora_rank * h * qk) if m.q_lora_rank else 2 * n * d * h * qk
    kv_a = 2 * n * d * (m.kv_lora_rank + m.qk_rope_head_dim)
    kv_b = 2 * n * m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim)
    o = 2 * n * h * m.v_head_dim * d
    scores = 2 * h * (qk + m.v_head_dim) * _causal_context_sum(n, prefix_tokens)
    return float(q + kv_a + kv_b + o + scores)


def mamba2_layer_flops(m: Mamba2Dims, d: int, num_tokens: int) -> float:
    """One Mamba2 layer: in_proj to ``2*d_inner + 2*n_groups*d_state + n_heads`` (z, xBC, dt),
    depthwise conv ``2*channels*K``, the scan in recurrent form ``5*d_inner*d_state`` per token
    (state decay and B x outer-product update 3, C readout 2) and out_proj. Element-wise gate,
    norm and D-skip terms (O(d_inner)) are not counted."""
    n = num_tokens
    in_proj = 2 * n * d * (2 * m.d_inner + 2 * m.n_groups * m.d_state + m.num_heads)
    conv = 2 * n * m.conv_channels * m.conv_kernel
    scan = 5 * n * m.d_inner * m.d_state
    out_proj = 2 * n * m.d_inner * d
    return float(in_proj + conv + scan + out_proj)


def mamba1_layer_flops(m: Mamba1Dims, d: int, num_tokens: int) -> float:
    """One Mamba (v1) layer: in_proj to ``2*d_inner``, conv, x_proj to ``dt_rank + 2*d_state``,
    dt_proj, the selective scan ``7*d_inner*d_state`` per token (discretise dt*A and exp 2,
    decay and update 3, readout 2) and out_proj."""
    n = num_tokens
    in_proj = 2 * n * d * 2 * m.d_inner
    conv = 2 * n * m.d_inner * m.conv_kernel
    x_proj = 2 * n * m.d_inner * (m.dt_rank + 2 * m.d_state)
    dt_proj = 2 * n * m.dt_rank * m.d_inner
    scan = 7 * n * m.d_inner * m.d_state
    out_proj = 2 * n * m.d_inner * d
    return float(in_proj + conv + x_proj + dt_proj + scan + out_proj)


def gdn_layer_flops(g: GDNDims, d: int, num_tokens: int) -> float:
    """One Gated DeltaNet layer. The first three terms are the SGLang Marconi fork's formula
    (``marconi_utils.py``): input projections ``2*L*D*(2*key_dim + 2*value_dim + 2*n_v_heads)``
    (q, k, v, z, beta, g), delta-rule state work ``8*L*value_dim*head_k_dim`` and
    ``4*L*value_dim`` element-wise. That formula omits two matmul terms, which we add: the
    depthwise conv over q, k, v ``2*L*(2*key_dim + value_dim)*K`` and out_proj
    ``2*L*value_dim*D``."""
    n = num_tokens
    ref = (
        2 * n * d * (2 * g.key_dim + 2 * g.value_dim + 2 * g.num_v_heads)
        + 8 * n * g.value_dim * g.head_k_dim
        + 4 * n * g.value_dim
    )
    conv = 2 * n * g.conv_channels * g.conv_kernel
    out_proj = 2 * n * g.value_dim * d
    return float(ref + conv + out_proj)


def short_conv_layer_flops(s: ShortConvDims, d: int, num_tokens: int) -> float:
    """One gated short-conv layer (LFM2): in_proj ``D -> 3D`` (B, C, x), depthwise conv
    ``2*D*K`` and out_proj ``D -> D``; the two element-wise gates are not counted."""
    n = num_tokens
    return float(2 * n * d * 3 * d + 2 * n * d * s.conv_kernel + 2 * n * d * d)


def mlp_layer_flops(m: MLPDims, d: int, num_tokens: int) -> float:
    """Dense FFN: ``6*L*D*I`` gated (SwiGLU), ``4*L*D*I`` ungated."""
    return float((6 if m.gated else 4) * num_tokens * d * m.intermediate_size)


def moe_layer_flops(m: MoEDims, d: int, num_tokens: int) -> float:
    """MoE FFN: ``6*L*D*(top_k*I_moe + I_shared)`` (4 instead of 6 when ungated) plus the
    router ``2*L*D*E``. Not counted: expert selection and scatter, and Qwen3-Next's scalar
    shared-expert gate (``2*L*D``, under 0.1% of the layer)."""
    per = 6 if m.gated else 4
    experts = per * num_tokens * d * (m.top_k * m.expert_intermediate_size + m.shared_intermediate_size)
    router = 2 * num_tokens * d * m.num_experts
    return float(experts + router)


# --------------------------------------------------------------------------------------------
# the reference simulator's formulas (marconi_reference mode)


def ref_attn_flops(L: int | float, D: int | float) -> float:
    """Attention FLOPs per layer exactly as the Marconi reference simulator computes them:
    ``8*L*D^2 + 4*L^2*D`` (MHA, whole sequence of length L from position 0)."""
    return float(8 * L * D * D + 4 * L * L * D)


def ref_mlp_flops(L: int | float, D: int | float) -> float:
    """MLP FLOPs per layer as in the Marconi reference: ``16*L*D^2`` (4x up-projection)."""
    return float(16 * L * D * D)


def ref_mamba_flops(L: int | float, D: int | float, N: int | float) -> float:
    """Mamba FLOPs per layer as in the Marconi reference, camera-ready form:
    ``12*L*D^2 + 16*L*D*N + 10*L*D`` (the original submission had ``10*L`` as the last term)."""
    return float(12 * L * D * D + 16 * L * D * N + 10 * L * D)


def ref_kv_bytes(L: int | float, D: int | float) -> float:
    """KV bytes per attention layer as in the Marconi reference: ``2*L*D*2`` (K and V, fp16,
    MHA-sized: the reference ignores GQA, a known quirk kept on purpose)."""
    return float(2 * L * D * 2)


def ref_state_bytes(D: int | float, N: int | float) -> float:
    """SSM state bytes per layer as in the Marconi reference: ``D*N*2 + (2*D + 2*N)*4*2``
    (state in fp16 plus a conv term assuming kernel 4, expand 2). Quirks kept on purpose."""
    return float(D * N * 2 + (2 * D + 2 * N) * 4 * 2)


def ref_node_savings(
    l_total: int,
    l_parent: int,
    D: int,
    N: int,
    n_attn: int,
    n_ssm: int,
    n_mlp: int,
) -> float:
    """FLOPs a hit on a radix node saves, exactly as the reference simulator computes it:
    ``n_ssm*mamba(l_node) + n_attn*(attn(l_total) - attn(l_parent)) + n_mlp*(mlp(l_total) -
    attn(l_parent))`` with ``l_node = l_total - l_parent``. The ``attn`` in the MLP term is the
    reference's bug, reproduced deliberately."""
    l_node = l_total - l_parent
    return (
        n_ssm * ref_mamba_flops(l_node, D, N)
        + n_attn * (ref_attn_flops(l_total, D) - ref_attn_flops(l_parent, D))
        + n_mlp * (ref_mlp_flops(l_total, D) - ref_attn_flops(l_parent, D))
    )


def ref_node_memory(l_total: int, D: int, N: int, n_attn: int, n_ssm: int) -> float:
    """Bytes charged to a radix node by the reference: ``n_ssm*state + n_attn*KV(l_total)``,
    i.e. the whole path's KV rather than the node's own (reference quirk)."""
    return n_ssm * ref_state_bytes(D, N) + n_attn * ref_kv_bytes(l_total, D)


def ref_node_efficiency(
    l_total: int,
    l_parent: int,
    D: int,
    N: int,
    n_attn: int,
    n_ssm: int,
    n_mlp: int,
) -> float:
    """Reference FLOP efficiency of a node: :func:`ref_node_savings` / :func:`ref_node_memory`."""
    mem = ref_node_memory(l_total, D, N, n_attn, n_ssm)
    if mem <= 0:
        return 0.0
    return ref_node_savings(l_total, l_parent, D, N, n_attn, n_ssm, n_mlp) / mem


