"""Every formula of the two accountings, against hand computations."""

from __future__ import annotations

import pytest

from hybrid_connector.geometry.model import ref_attn_flops, ref_mamba_flops, ref_mlp_flops
from hybrid_connector.geometry.presets import get_preset, marconi_ref_params
from hybrid_connector.policies.eviction.accounting import CorrectedAccounting, ReferenceAccounting


def test_corrected_efficiency_is_edge_flops_over_freed_bytes(geo) -> None:
    acct = CorrectedAccounting(geo)
    saved = geo.flops_saved(300, 700).total  # edge [700, 1000) given a 700-token prefix
    leaf_bytes = 300 * geo.kv_bytes_per_token() + geo.state_bytes()
    assert acct.efficiency(1000, 700, True, True) == pytest.approx(saved / leaf_bytes)
    # A single-child node frees only its state.
    assert acct.efficiency(1000, 700, True, False) == pytest.approx(saved / geo.state_bytes())
    # A tombstone leaf frees only its KV.
    kv = 300 * geo.kv_bytes_per_token()
    assert acct.efficiency(1000, 700, False, True) == pytest.approx(saved / kv)
    assert acct.efficiency(1000, 700, False, False) == 0.0
    with pytest.raises(ValueError, match="empty edge"):
        acct.efficiency(5, 5, True, True)


def test_corrected_bytes_are_gqa_aware() -> None:
    qwen = get_preset("qwen3.5-4b")  # 4 KV heads of 16: GQA
    acct = CorrectedAccounting(qwen)
    a = qwen.attention
    assert a is not None
    per_tok = len(qwen.attention_layers) * 2 * a.num_kv_heads * a.head_dim * 2
    assert acct.node_bytes(100, 0, False, True) == 100 * per_tok


def test_deeper_edges_are_worth_more_per_byte(geo) -> None:
    """Attention's quadratic term: the same 256-token edge saves more deeper in a context."""
    acct = CorrectedAccounting(geo)
    assert acct.efficiency(20_256, 20_000, True, True) > acct.efficiency(256, 0, True, True)


def test_reference_accounting_reproduces_the_reference_quirks(geo) -> None:
    acct = ReferenceAccounting(geo)
    p = marconi_ref_params(geo)
    D, N = p["D"], p["N"]
    l_total, l_parent = 1000, 700
    savings = (
        p["n_ssm"] * ref_mamba_flops(300, D, N)
        + p["n_attn"] * (ref_attn_flops(1000, D) - ref_attn_flops(700, D))
        + p["n_mlp"] * (ref_mlp_flops(1000, D) - ref_attn_flops(700, D))  # the MLP-term bug
    )
    state = D * N * 2 + (2 * D + 2 * N) * 4 * 2
    memory = p["n_ssm"] * state + p["n_attn"] * 2 * l_total * D * 2  # path-level KV
    assert acct.efficiency(l_total, l_parent, True, True) == pytest.approx(savings / memory)
    # Leafness and state presence do not matter to the reference.
    assert acct.efficiency(l_total, l_parent, False, False) == acct.efficiency(l_total, l_parent, True, True)


def test_hit_flops(geo) -> None:
    assert CorrectedAccounting(geo).hit_flops(512) == geo.flops_saved(512).total
    assert CorrectedAccounting(geo).hit_flops(0) == 0.0
    ref = ReferenceAccounting(geo)
    p = marconi_ref_params(geo)
    want = (p["n_ssm"] * ref_mamba_flops(512, p["D"], p["N"]) + p["n_attn"] * ref_attn_flops(512, p["D"])
            + p["n_mlp"] * ref_mlp_flops(512, p["D"]))
    assert ref.hit_flops(512) == pytest.approx(want)
