"""Model geometry: every figure against a hand computation with the published numbers.

The expected values below are written out from the models' published configs, not computed
with the code under test. The tiny-model tests check the geometry against what transformers
actually allocates and multiplies.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from hybrid_connector.geometry.model import (
    AttentionDims,
    FFNKind,
    FlopBreakdown,
    GDNDims,
    LayerSpec,
    Mamba2Dims,
    MixerKind,
    MLPDims,
    ModelGeometry,
    ShortConvDims,
    TensorSpec,
    dtype_bytes,
    ref_attn_flops,
    ref_kv_bytes,
    ref_mamba_flops,
    ref_mlp_flops,
    ref_node_efficiency,
    ref_node_memory,
    ref_node_savings,
    ref_state_bytes,
)
from hybrid_connector.geometry.presets import (
    EXTRA_TINY_ARCHS,
    PRESETS,
    TINY_ARCHS,
    get_preset,
    load_geometry,
    marconi_ref_params,
    tiny_hf_config,
)
from hybrid_connector.payload.layout import kv_layout, state_layout

MiB = 2**20


def causal(n: int, p: int) -> int:
    """sum_{t=p}^{p+n-1} (t + 1), written as a plain loop so it is independent of the code."""
    return sum(t + 1 for t in range(p, p + n))


# ------------------------------------------------------------------------------------------
# Qwen3.5-4B: hidden 2560, 32 layers (24 GDN + 8 attn), 16 q / 4 kv heads x 256 gated,
# GDN 16 k / 32 v heads x 128, conv 4, SwiGLU 9216, bf16 + fp32 state


def test_qwen3_5_4b_bytes() -> None:
    g = get_preset("qwen3.5-4b")
    assert len(g.attention_layers) == 8 and len(g.recurrent_layers) == 24
    # KV: 8 layers x (K+V) x 4 kv heads x 256 x 2 bytes = 32 KiB per token
    assert g.kv_bytes_per_token() == 8 * 2 * 4 * 256 * 2 == 32768
    # conv: (2*16*128 + 32*128) = 8192 channels x 3 x bf16; recurrent 32 x 128 x 128 x fp32
    per_layer = 8192 * 3 * 2 + 32 * 128 * 128 * 4
    assert per_layer == 2_146_304
    assert g.state_bytes_per_layer()[0] == 2_146_304
    assert g.state_bytes() == 24 * 2_146_304 == 51_511_296
    assert g.state_bytes() / MiB == pytest.approx(49.125)
    # vLLM's mamba-aligned block for this model is 528 tokens: ceil(2,146,304 / 4096) -> 16-mult
    per_layer_kv_token = 2 * 4 * 256 * 2
    assert math.ceil(2_146_304 / per_layer_kv_token / 16) * 16 == 528
    # 8 groups of 3 GDN layers; one bf16 hidden state per group
    assert g.recurrent_groups() == tuple((4 * k, 4 * k + 1, 4 * k + 2) for k in range(8))
    assert g.anchor_bytes_per_token() == 2560 * 2 * 8 == 40960


def test_qwen3_5_4b_flops() -> None:
    g = get_preset("qwen3.5-4b")
    n, p = 1000, 3000
    f = g.flops_saved(n, p)
    attn_layer = (
        2 * n * 2560 * (16 * 256 * 2)  # q + gate
        + 2 * n * 2560 * (2 * 4 * 256)  # k, v
        + 2 * n * (16 * 256) * 2560  # o
        + 4 * 16 * 256 * causal(n, p)
    )
    gdn_layer = (
        2 * n * 2560 * (2 * 2048 + 2 * 4096 + 2 * 32)  # q k v z b a
        + 8 * n * 4096 * 128
        + 4 * n * 4096
        + 2 * n * 8192 * 4  # conv over q, k, v channels
        + 2 * n * 4096 * 2560  # out_proj
    )
    assert f.attention == 8 * attn_layer
    assert f.gdn == 24 * gdn_layer
    assert f.mlp == 32 * 6 * n * 2560 * 9216
    assert f.mamba2 == f.mamba1 == f.moe == f.short_conv == 0
    assert f.total == 8 * attn_layer + 24 * gdn_layer + 32 * 6 * n * 2560 * 9216
    # the quadratic term grows with the prefix, nothing else does
    f0 = g.flops_saved(n, 0)
    assert f.attention - f0.attention == 8 * 4 * 16 * 256 * n * p
    assert (f.gdn, f.mlp) == (f0.gdn, f0.mlp)


# ------------------------------------------------------------------------------------------
# Nemotron-H-8B: hidden 4096, pattern of 24 M / 4 * / 24 -, 32 q / 8 kv x 128,
# Mamba2 128 heads x 64, d_state 128, 8 groups, conv 4, relu2 MLP 21504


def test_nemotron_h_8b() -> None:
    g = get_preset("nemotron-h-8b")
    assert g.num_layers == 52
    assert g.layer_counts()["mamba2"] == 24 and g.layer_counts()["mlp"] == 24
    assert g.attention_layers == (7, 18, 29, 40)  # the '*' positions of the published pattern
    assert g.kv_bytes_per_token() == 4 * 2 * 8 * 128 * 2 == 16384
    conv = (8192 + 2 * 8 * 128) * 3 * 2  # 10240 channels
    rec = 128 * 64 * 128 * 4
    assert conv + rec == 4_255_744
    assert g.state_bytes() == 24 * 4_255_744 == 102_137_856
    assert len(g.recurrent_groups()) == 5
    assert g.recurrent_groups()[0] == (0, 2, 4, 6)  # '-' MLP layers do not break a run
    assert g.anchor_bytes_per_token() == 4096 * 2 * 5
    n = 512
    f = g.flops_saved(n)
    mamba_layer = (
        2 * n * 4096 * (2 * 8192 + 2 * 8 * 128 + 128)
        + 2 * n * 10240 * 4
        + 5 * n * 8192 * 128
        + 2 * n * 8192 * 4096
    )
    attn_layer = 2 * n * 4096 * (4096 + 2 * 8 * 128) + 2 * n * 4096 * 4096 + 4 * 32 * 128 * causal(n, 0)
    assert f.mamba2 == 24 * mamba_layer
    assert f.attention == 4 * attn_layer
    assert f.mlp == 24 * 4 * n * 4096 * 21504  # ungated
    assert f.gdn == f.moe == 0


# ------------------------------------------------------------------------------------------
# Jamba-1.5-Mini: hidden 4096, 32 layers, attention at i % 8 == 4, Mamba1 d_inner 8192,
# d_state 16, conv 4, dt_rank 256; MoE 16 x top-2 x 14336 on odd layers


def test_jamba_1_5_mini() -> None:
    g = get_preset("jamba-1.5-mini")
    assert g.attention_layers == (4, 12, 20, 28)
    assert len(g.recurrent_layers) == 28
    assert g.kv_bytes_per_token() == 4 * 2 * 8 * 128 * 2 == 16384
    assert g.state_bytes() == 28 * (8192 * 3 * 2 + 8192 * 16 * 4) == 16_056_320
    assert g.recurrent_groups() == (
        (0, 1, 2, 3),
        tuple(range(5, 12)),
        tuple(range(13, 20)),
        tuple(range(21, 28)),
        (29, 30, 31),
    )
    assert g.anchor_bytes_per_token() == 4096 * 2 * 5
    n = 256
    f = g.flops_saved(n)
    assert f.moe == 16 * (6 * n * 4096 * (2 * 14336) + 2 * n * 4096 * 16)
    assert f.mlp == 16 * 6 * n * 4096 * 14336
    mamba1_layer = (
        2 * n * 4096 * 16384
        + 2 * n * 8192 * 4
        + 2 * n * 8192 * (256 + 32)
        + 2 * n * 256 * 8192
        + 7 * n * 8192 * 16
        + 2 * n * 8192 * 4096
    )
    assert f.mamba1 == 28 * mamba1_layer
    assert f.mamba2 == 0


def test_qwen3_next_moe_and_other_presets() -> None:
    g = get_preset("qwen3-next-80b-a3b")
    assert g.kv_bytes_per_token() == 12 * 2 * 2 * 256 * 2
    assert g.state_bytes() == 36 * ((2 * 2048 + 4096) * 3 * 2 + 32 * 128 * 128 * 4)
    assert g.flops_saved(100).moe == 48 * (6 * 100 * 2048 * (10 * 512 + 512) + 2 * 100 * 2048 * 512)
    assert g.flops_saved(100).mlp == 0
    small = get_preset("qwen3.5-0.8b")
    assert small.state_bytes() == 18 * ((2 * 2048 + 2048) * 3 * 2 + 16 * 128 * 128 * 4)
    # vLLM aligns this model's attention pages to 544-token blocks
    assert math.ceil(small.state_bytes_per_layer()[0] / (2 * 2 * 256 * 2) / 16) * 16 == 544
    bamba = get_preset("bamba-9b")
    assert bamba.attention_layers == (9, 18, 27)
    assert bamba.state_bytes() == 29 * ((8192 + 2 * 128) * 3 * 2 + 128 * 64 * 128 * 4)
    for name in PRESETS:
        geom = get_preset(name)
        assert ModelGeometry.from_dict(geom.to_dict()) == geom
        assert geom.flops_saved(64).total > 0


# ------------------------------------------------------------------------------------------
# layouts, TP, groups


def test_layouts_sum_to_bytes() -> None:
    g = get_preset("qwen3.5-4b")
    layout = state_layout(g).specs
    assert layout[0] == TensorSpec("layers.0.conv_state", (8192, 3), "bfloat16")
    assert layout[1] == TensorSpec("layers.0.recurrent_state", (32, 128, 128), "float32")
    assert [t.name for t in layout[2:4]] == ["layers.1.conv_state", "layers.1.recurrent_state"]
    assert sum(t.nbytes for t in layout) == g.state_bytes()
    kv = kv_layout(g, 7).specs
    assert len(kv) == 16 and kv[0] == TensorSpec("layers.3.k", (7, 4, 256), "bfloat16")
    assert sum(t.nbytes for t in kv) == 7 * g.kv_bytes_per_token()


def test_tensor_parallel_division() -> None:
    tp2 = get_preset("qwen3.5-4b", tp_size=2)
    assert tp2.kv_bytes_per_token() == 8 * 2 * 2 * 256 * 2
    assert tp2.state_bytes() == 24 * (4096 * 3 * 2 + 16 * 128 * 128 * 4)
    assert state_layout(tp2).specs[1].shape == (16, 128, 128)
    # 4 kv heads on 8 ranks: one replicated head per rank
    tp8 = get_preset("qwen3.5-4b", tp_size=8)
    assert tp8.kv_bytes_per_token() == 8 * 2 * 1 * 256 * 2
    assert tp8.flops_saved(10) == get_preset("qwen3.5-4b").flops_saved(10)  # whole-model FLOPs
    with pytest.raises(ValueError, match="divisible"):
        get_preset("qwen3.5-4b", tp_size=3)
    # Bamba has one B/C group: vLLM replicates it to tp groups before sharding
    b4 = get_preset("bamba-9b", tp_size=4)
    assert state_layout(b4).specs[0].shape == ((8192 + 2 * 4 * 128) // 4, 3)
    assert state_layout(b4).specs[1].shape == (32, 64, 128)
    # Nemotron-H has 8 groups: fine at tp 8, impossible at 16
    assert state_layout(get_preset("nemotron-h-8b", tp_size=8)).specs[0].shape == (10240 // 8, 3)
    with pytest.raises(ValueError, match="n_groups"):
        get_preset("nemotron-h-8b", tp_size=16)
    assert tp2.fingerprint_fields() != get_preset("qwen3.5-4b").fingerprint_fields()


def _geom(pattern: str, **kw: Any) -> ModelGeometry:
    kinds = {"A": MixerKind.ATTENTION, "M": MixerKind.MAMBA2, "-": MixerKind.NONE, "S": MixerKind.SHORT_CONV}
    layers = tuple(
        LayerSpec(i, kinds[c], FFNKind.MLP if c == "-" else FFNKind.NONE) for i, c in enumerate(pattern)
    )
    return ModelGeometry(
        name="t",
        architecture="test",
        hidden_size=64,
        vocab_size=100,
        layers=layers,
        attention=AttentionDims(4, 2, 16),
        mamba2=Mamba2Dims(8, 16, 16, 1, 4),
        short_conv=ShortConvDims(3),
        mlp=MLPDims(128),
        **kw,
    )


def test_recurrent_groups() -> None:
    assert _geom("MM-MAM-MAA").recurrent_groups() == ((0, 1, 3), (5, 7))
    assert _geom("AAM").recurrent_groups() == ((2,),)
    assert _geom("A-A").recurrent_groups() == ()
    assert _geom("A-A").state_bytes() == 0 and _geom("A-A").anchor_bytes_per_token() == 0
    assert _geom("MSM").recurrent_groups() == ((0, 1, 2),)
    # short conv: conv state only, hidden x (kernel - 1)
    s = _geom("S")
    assert state_layout(s).specs == (TensorSpec("layers.0.conv_state", (64, 2), "bfloat16"),)
    assert s.flops_saved(10).short_conv == 2 * 10 * 64 * 192 + 2 * 10 * 64 * 3 + 2 * 10 * 64 * 64
    assert s.kv_bytes_per_token() == 0


def test_hybrid_parallel_falcon_h1_style() -> None:
    layers = tuple(LayerSpec(i, MixerKind.HYBRID_PARALLEL, FFNKind.MLP) for i in range(3))
    g = ModelGeometry(
        name="f",
        architecture="falcon_h1",
        hidden_size=64,
        vocab_size=100,
        layers=layers,
        attention=AttentionDims(4, 2, 16),
        mamba2=Mamba2Dims(8, 16, 16, 1, 4),
        mlp=MLPDims(128),
    )
    assert g.attention_layers == g.recurrent_layers == (0, 1, 2)
    assert g.recurrent_groups() == ((0,), (1,), (2,))
    assert g.kv_bytes_per_token() == 3 * 2 * 2 * 16 * 2
    assert g.state_bytes() == 3 * ((128 + 2 * 16) * 3 * 2 + 8 * 16 * 16 * 4)
    f = g.flops_saved(5)
    assert f.attention > 0 and f.mamba2 > 0
    with pytest.raises(ValueError, match="mamba2"):
        ModelGeometry(
            name="f", architecture="x", hidden_size=64, vocab_size=100, layers=layers,
            attention=AttentionDims(4, 2, 16), mlp=MLPDims(128),
        )  # fmt: skip


def test_validation_errors() -> None:
    with pytest.raises(ValueError, match="needs `gdn`"):
        ModelGeometry(
            name="x", architecture="x", hidden_size=8, vocab_size=8,
            layers=(LayerSpec(0, MixerKind.GDN, FFNKind.NONE),),
        )  # fmt: skip
    with pytest.raises(ValueError, match="index"):
        ModelGeometry(
            name="x", architecture="x", hidden_size=8, vocab_size=8,
            layers=(LayerSpec(1, MixerKind.NONE, FFNKind.NONE),),
        )  # fmt: skip
    with pytest.raises(ValueError, match="unknown dtype"):
        _geom("M", dtype="float7")
    with pytest.raises(ValueError, match="not a multiple of num_kv_heads"):
        ModelGeometry(
            name="x", architecture="x", hidden_size=8, vocab_size=8,
            layers=(LayerSpec(0, MixerKind.ATTENTION, FFNKind.NONE),), attention=AttentionDims(6, 4, 8),
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"mamba2.d_state must be an integer >= 1"):
        ModelGeometry(
            name="x", architecture="x", hidden_size=8, vocab_size=8,
            layers=(LayerSpec(0, MixerKind.MAMBA2, FFNKind.NONE),), mamba2=Mamba2Dims(2, 4, 0, 1, 4),
        )  # fmt: skip
    with pytest.raises(ValueError, match="unknown model preset 'nope'.*qwen3.5-4b"):
        get_preset("nope")
    assert dtype_bytes("bf16") == 2 and dtype_bytes("torch.float32") == 4 and dtype_bytes("fp8") == 1


# ------------------------------------------------------------------------------------------
# Marconi reference formulas (D=4096, N=128, fp16: the 7B hybrid)


def test_reference_formulas() -> None:
    L, D, N = 1000, 4096, 128
    assert ref_attn_flops(L, D) == 8 * 1000 * 4096**2 + 4 * 1000**2 * 4096
    assert ref_mlp_flops(L, D) == 16 * 1000 * 4096**2
    assert ref_mamba_flops(L, D, N) == 12 * 1000 * 4096**2 + 16 * 1000 * 4096 * 128 + 10 * 1000 * 4096
    assert ref_kv_bytes(L, D) == 2 * 1000 * 4096 * 2
    assert ref_state_bytes(D, N) == 4096 * 128 * 2 + (2 * 4096 + 2 * 128) * 4 * 2 == 1_116_160
    # blog: attention saves L + 2D FLOPs per KV byte
    assert ref_attn_flops(L, D) / (ref_kv_bytes(L, D) * 1) == 1000 + 2 * 4096
    # node savings keep the reference bug: the MLP term subtracts attn(l_parent)
    s = ref_node_savings(1500, 1000, D, N, n_attn=4, n_ssm=24, n_mlp=28)
    expect = (
        24 * ref_mamba_flops(500, D, N)
        + 4 * (ref_attn_flops(1500, D) - ref_attn_flops(1000, D))
        + 28 * (ref_mlp_flops(1500, D) - ref_attn_flops(1000, D))
    )
    assert s == expect
    assert ref_node_memory(1500, D, N, 4, 24) == 24 * 1_116_160 + 4 * 2 * 1500 * 4096 * 2
    assert ref_node_efficiency(1500, 1000, D, N, 4, 24, 28) == expect / (24 * 1_116_160 + 4 * 2 * 1500 * 4096 * 2)
    assert marconi_ref_params(get_preset("marconi-7b")) == {
        "D": 4096,
        "N": 128,
        "n_attn": 4,
        "n_ssm": 24,
        "n_mlp": 28,
    }
    m = get_preset("marconi-7b")
    # our MHA fp16 KV equals the reference's MHA KV per layer
    assert m.kv_bytes_per_token() == 4 * ref_kv_bytes(1, 4096)
    # ungated 4D MLP is the reference's 16 L D^2
    assert m.flops_saved(1000).mlp == 28 * ref_mlp_flops(1000, 4096)


# ------------------------------------------------------------------------------------------
# serialisation


def test_dict_round_trip_and_fingerprint() -> None:
    g = get_preset("jamba-1.5-mini")
    d = g.to_dict()
    assert d["layers"][4] == "attention+mlp" and d["layers"][1] == "mamba1+moe"
    assert ModelGeometry.from_dict(d) == g
    fp = g.fingerprint_fields()
    assert "name" not in fp and fp["dtype"] == "bfloat16" and fp["tp_size"] == 1
    assert _geom("M").fingerprint_fields() != _geom("M", state_dtype="bfloat16").fingerprint_fields()
    assert _geom("M").fingerprint_fields() != _geom("MA").fingerprint_fields()
    # mapping form of layers is accepted too
    d2 = {**d, "layers": [{"mixer": x.split("+")[0], "ffn": x.split("+")[1]} for x in d["layers"]]}
    assert ModelGeometry.from_dict(d2) == g


def test_from_yaml(tmp_path: Path) -> None:
    import yaml

    good = tmp_path / "m.yaml"
    good.write_text(yaml.safe_dump({"model": get_preset("qwen3.5-0.8b").to_dict()}))
    assert ModelGeometry.from_yaml(good) == get_preset("qwen3.5-0.8b")

    def bad(name: str, data: object, match: str) -> None:
        p = tmp_path / name
        p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
        with pytest.raises(ValueError, match=match) as ei:
            ModelGeometry.from_yaml(p)
        assert str(p) in str(ei.value)

    base = get_preset("qwen3.5-0.8b").to_dict()
    bad("k.yaml", {**base, "hiden_size": 3}, "unknown key 'hiden_size'")
    bad("m.yaml", {k: v for k, v in base.items() if k != "vocab_size"}, "missing required key 'vocab_size'")
    bad("l.yaml", {**base, "layers": ["gdn+mlp", "mamba3+mlp"]}, r"layers\[1\].*unknown mixer 'mamba3'")
    bad("d.yaml", {**base, "gdn": {**base["gdn"], "num_heads": 2}}, "key 'gdn'.*unknown key 'num_heads'")
    bad("t.yaml", {**base, "hidden_size": "big"}, "'hidden_size' must be an integer")
    bad("s.yaml", "a: [1, 2", "invalid YAML")
    bad("n.yaml", {**base, "gdn": None}, "needs `gdn`")
    with pytest.raises(ValueError, match="cannot read"):
        ModelGeometry.from_yaml(tmp_path / "missing.yaml")


# ------------------------------------------------------------------------------------------
# transformers configs


def _published_hf_configs() -> dict[str, Any]:
    """transformers config objects carrying the published numbers (no weights are built)."""
    import transformers as tf

    return {
        "qwen3.5-4b": tf.Qwen3_5Config(
            text_config={
                "hidden_size": 2560, "intermediate_size": 9216, "num_hidden_layers": 32,
                "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
                "linear_num_key_heads": 16, "linear_num_value_heads": 32, "vocab_size": 248320,
                "dtype": "bfloat16",
            }
        ),
        "qwen3-next-80b-a3b": tf.Qwen3NextConfig(
            hidden_size=2048, intermediate_size=5120, num_hidden_layers=48, dtype="bfloat16",
        ),
        "nemotron-h-8b": tf.NemotronHConfig(
            hidden_size=4096, hybrid_override_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
            num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=21504,
            mamba_num_heads=128, mamba_head_dim=64, ssm_state_size=128, n_groups=8,
            vocab_size=131072, dtype="bfloat16",
        ),
        "kimi-linear-48b-a3b": tf.KimiLinearConfig(dtype="bfloat16", linear_attn_config={
            "full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128, "num_heads": 32,
            "kda_layers": [i for i in range(1, 28) if i % 4 and i != 27]}),
        "jamba-1.5-mini": tf.JambaConfig(dtype="bfloat16", mamba_dt_rank=256),
        "bamba-9b": tf.BambaConfig(
            attn_layer_indices=[9, 18, 27], mamba_d_state=128, vocab_size=128256, dtype="bfloat16",
        ),
    }  # fmt: skip


@pytest.mark.parametrize("name", ["qwen3.5-4b", "qwen3-next-80b-a3b", "nemotron-h-8b", "jamba-1.5-mini",
                                  "bamba-9b", "kimi-linear-48b-a3b"])
def test_from_hf_config_matches_presets(name: str) -> None:
    cfg = _published_hf_configs()[name]
    assert ModelGeometry.from_hf_config(cfg).fingerprint_fields() == get_preset(name).fingerprint_fields()


def test_from_hf_config_errors_and_overrides() -> None:
    import transformers as tf

    with pytest.raises(ValueError, match="unsupported architecture 'llama'"):
        ModelGeometry.from_hf_config(tf.LlamaConfig())
    g = ModelGeometry.from_hf_config(tiny_hf_config("qwen3_5"), dtype="fp16", tp_size=2, name="x")
    assert (g.dtype, g.tp_size, g.name) == ("float16", 2, "x")
    with pytest.raises(ValueError, match="unknown tiny architecture"):
        tiny_hf_config("llama")


@pytest.mark.parametrize(("cls", "arch", "layer", "why"), [
    ("BailingHybridConfig", "bailing_hybrid", 5, "multi-head latent attention"),
    ("DeepseekV3Config", "deepseek_v3", 0, "multi-head latent attention"),
    ("MiMoV2FlashConfig", "mimo_v2_flash", 0, r"QK head size 192 != V head size 128"),
    ("Glm5NextConfig", "glm5_next", 3, r"indexed attention .*indexer keys"),
    ("Qwen4ExpConfig", "qwen4_exp", 3, "indexed attention"),
    ("DeepseekV32Config", "deepseek_v32", 0, "indexed attention"),
])  # fmt: skip
def test_from_hf_config_refuses_mla_and_indexed_attention(cls: str, arch: str, layer: int, why: str) -> None:
    # Kimi Linear's MLA is supported (its cache layout is mapped): tests/hf/test_exact.py.
    """Attention a KV chunk cannot hold is refused by name, layer and reason (the published
    default configs of the real classes), before the architecture is even looked up."""
    import transformers as tf

    with pytest.raises(ValueError, match=rf"^{arch}: layer {layer} is .*{why}"):
        ModelGeometry.from_hf_config(getattr(tf, cls)())


def _cache_shapes(pkv: Any) -> dict[str, tuple[int, ...]]:
    import torch

    out: dict[str, tuple[int, ...]] = {}
    for i, layer in enumerate(pkv.layers):
        for attr, tag in (("keys", "k"), ("values", "v")):
            t = getattr(layer, attr, None)
            if isinstance(t, torch.Tensor) and t.numel():
                out[f"layers.{i}.{tag}"] = tuple(t.shape)
        for attr, tag in (("conv_states", "conv_state"), ("recurrent_states", "recurrent_state")):
            states = getattr(layer, attr, None) or {}
            t = states.get(0) if isinstance(states, dict) else None
            if isinstance(t, torch.Tensor):
                out[f"layers.{i}.{tag}"] = tuple(t.shape)
    return out


_RUNS: dict[str, tuple[Any, Any, dict[str, float]]] = {}


def _run_tiny(arch: str) -> tuple[Any, Any, dict[str, float]]:
    """Build the tiny model once, run 12 tokens with a cache under a FLOP counter."""
    if arch not in _RUNS:
        import torch
        from torch.utils.flop_counter import FlopCounterMode
        from transformers import AutoModelForCausalLM

        cfg = tiny_hf_config(arch)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).eval()
        ids = torch.randint(3, cfg.vocab_size, (1, 12))
        with torch.no_grad(), FlopCounterMode(display=False) as fc:
            out = model(ids, use_cache=True)
        assert out.logits.shape == (1, 12, cfg.vocab_size)
        assert out.logits.dtype == torch.float32 and torch.isfinite(out.logits).all()
        mm = {
            k.split(".", 1)[1]: float(sum(c for op, c in v.items() if str(op) == "aten.mm"))
            for k, v in fc.get_flop_counts().items()
            if "." in k
        }
        _RUNS[arch] = (cfg, out.past_key_values, mm)
    return _RUNS[arch]


@pytest.mark.parametrize("arch", TINY_ARCHS + EXTRA_TINY_ARCHS)
def test_tiny_model_cache_matches_geometry(arch: str) -> None:
    cfg, pkv, _ = _run_tiny(arch)
    g = ModelGeometry.from_hf_config(cfg)
    assert ModelGeometry.from_dict(g.to_dict()) == g
    assert g.dtype == "float32"
    assert g.attention_layers and g.recurrent_layers
    hf = _cache_shapes(pkv)
    ours = {t.name: t.shape for t in state_layout(g).specs + kv_layout(g, 12).specs}
    assert set(hf) == set(ours)
    for name, shape in ours.items():
        if name.endswith(".conv_state"):
            # transformers keeps the full kernel width, we (and vLLM) keep kernel - 1
            assert hf[name] == (1, shape[0], shape[1] + 1), name
        elif name.endswith(".recurrent_state"):
            assert hf[name] == (1, *shape), name
        else:  # hf KV is [batch, kv_heads, tokens, head_dim]
            assert hf[name] == (1, shape[1], shape[0], shape[2]), name


# Projection FLOPs of each tiny model, by hand from tiny_hf_config's numbers: L=12, D=64,
# attention 4 q / 2 kv heads x 16; GDN 2 k / 4 v heads x 16; Mamba2 8 heads x 16, N 16,
# 2 groups; Jamba d_inner 128, N 8, dt_rank 8; MLP 128 (granite shared 64); MoE router 4.
_L, _D = 12, 64
_ATTN_PROJ = 2 * _L * _D * (64 + 2 * 32) + 2 * _L * 64 * _D
_ATTN_PROJ_GATED = _ATTN_PROJ + 2 * _L * _D * 64
_GDN_PROJ = 2 * _L * _D * (2 * 32 + 2 * 64 + 2 * 4) + 2 * _L * 64 * _D
_MAMBA2_PROJ = 2 * _L * _D * (2 * 128 + 2 * 2 * 16 + 8) + 2 * _L * 128 * _D
_MAMBA1_PROJ = 2 * _L * _D * 256 + 2 * _L * 128 * (8 + 16) + 2 * _L * 8 * 128 + 2 * _L * 128 * _D
_SWIGLU_128 = 6 * _L * _D * 128


@pytest.mark.parametrize(
    ("arch", "module", "expected"),
    [
        ("qwen3_5", "model.layers.0.linear_attn", _GDN_PROJ),
        ("qwen3_5", "model.layers.2.self_attn", _ATTN_PROJ_GATED),
        ("qwen3_5", "model.layers.0.mlp", _SWIGLU_128),
        ("nemotron_h", "model.layers.0.mixer", _MAMBA2_PROJ),
        ("nemotron_h", "model.layers.1.mixer", 4 * _L * _D * 128),  # relu2, ungated
        ("nemotron_h", "model.layers.2.mixer", _ATTN_PROJ),
        # MoE: router + ungated shared expert (routed experts run in grouped kernels)
        ("nemotron_h", "model.layers.5.mixer", 2 * _L * _D * 4 + 4 * _L * _D * 32),
        ("bamba", "model.layers.0.mamba", _MAMBA2_PROJ),
        ("jamba", "model.layers.1.mamba", _MAMBA1_PROJ),
        ("jamba", "model.layers.0.feed_forward", _SWIGLU_128),
        ("falcon_h1", "model.layers.1.mamba", _MAMBA2_PROJ),
        ("falcon_h1", "model.layers.1.self_attn", _ATTN_PROJ),
        ("granitemoehybrid", "model.layers.1.shared_mlp", 6 * _L * _D * 64),
        ("granitemoehybrid", "model.layers.1.block_sparse_moe", 2 * _L * _D * 4),
        ("lfm2", "model.layers.0.conv", 2 * _L * _D * 3 * _D + 2 * _L * _D * _D),
        ("lfm2", "model.layers.0.feed_forward", _SWIGLU_128),
    ],
)
def test_tiny_projection_flops_match_real_modules(arch: str, module: str, expected: int) -> None:
    """The matmul terms of our formulas equal what the real transformers modules multiply."""
    _, _, mm = _run_tiny(arch)
    assert mm[module] == expected


def test_tiny_flops_formulas_use_those_projections() -> None:
    """...and the geometry's FLOPs are those projections plus the documented extra terms."""
    g = ModelGeometry.from_hf_config(tiny_hf_config("qwen3_5"))
    f = g.flops_saved(_L)
    assert f.gdn == 3 * (_GDN_PROJ + 8 * _L * 64 * 16 + 4 * _L * 64 + 2 * _L * 128 * 4)
    assert f.attention == _ATTN_PROJ_GATED + 4 * 4 * 16 * causal(_L, 0)
    assert f.mlp == 4 * _SWIGLU_128
    b = ModelGeometry.from_hf_config(tiny_hf_config("bamba"))
    assert b.flops_saved(_L).mamba2 == 4 * (_MAMBA2_PROJ + 2 * _L * 192 * 4 + 5 * _L * 128 * 16)
    j = ModelGeometry.from_hf_config(tiny_hf_config("jamba"))
    assert j.flops_saved(_L).mamba1 == 3 * (_MAMBA1_PROJ + 2 * _L * 128 * 4 + 7 * _L * 128 * 8)
    fh = ModelGeometry.from_hf_config(tiny_hf_config("falcon_h1"))
    assert fh.flops_saved(_L).attention == 4 * (_ATTN_PROJ + 4 * 4 * 16 * causal(_L, 0))


def test_load_geometry(tmp_path: Path) -> None:
    import yaml

    assert load_geometry("Qwen3.5-4B") == get_preset("qwen3.5-4b")
    assert load_geometry("Qwen/Qwen3.5-4B", tp_size=2).tp_size == 2
    p = tmp_path / "geo.yml"
    p.write_text(yaml.safe_dump(get_preset("bamba-9b").to_dict()))
    assert load_geometry(str(p)) == get_preset("bamba-9b")
    with pytest.raises(ValueError, match="missing.yaml"):
        load_geometry(str(tmp_path / "missing.yaml"))
    assert len({get_preset(n) for n in PRESETS}) == len(PRESETS)  # hashable, distinct


def test_qwen3_5_multimodal_wrapper() -> None:
    import transformers as tf

    text = tiny_hf_config("qwen3_5")
    wrapped = tf.Qwen3_5Config(text_config=text.to_dict())
    assert ModelGeometry.from_hf_config(wrapped).fingerprint_fields() == (
        ModelGeometry.from_hf_config(text).fingerprint_fields()
    )


def test_flop_breakdown_total_and_add() -> None:
    a = FlopBreakdown(1, 2, 3, 4, 5, 6)
    assert a.total == 21 and (a + a).total == 42 and (a + a).mamba1 == 0
    assert isinstance(GDNDims(1, 2, 3, 4, 5).conv_channels, int)


@pytest.mark.parametrize(("cls", "arch", "why"), [
    ("ZambaConfig", "zamba", r"multi-head Mamba \(v1\) mixer"),
    ("MiniMaxConfig", "minimax", r"MiniMaxCache\.linear_cache"),
    ("RecurrentGemmaConfig", "recurrent_gemma", r"state inside the modules"),
])  # fmt: skip
def test_from_hf_config_refuses_other_families_by_name(cls: str, arch: str, why: str) -> None:
    """Hybrid families transformers implements whose state the connector cannot hold are
    refused by name and reason (the published default configs of the real classes)."""
    import transformers as tf

    with pytest.raises(ValueError, match=rf"^{arch}: not supported: .*{why}"):
        ModelGeometry.from_hf_config(getattr(tf, cls)())


@pytest.mark.parametrize(("arch", "kinds"), [
    ("lfm2_moe", ["short_conv+mlp", "short_conv+moe", "attention+moe", "short_conv+moe"]),
    ("olmo_hybrid", ["gdn+mlp", "gdn+mlp", "attention+mlp", "gdn+mlp"]),
    ("zamba2", ["mamba2+none", "hybrid_parallel+mlp", "mamba2+none", "hybrid_parallel+mlp"]),
    ("mamba", ["mamba1+none"] * 3),
    ("mamba2", ["mamba2+none"] * 3),
    ("falcon_mamba", ["mamba1+none"] * 3),
])  # fmt: skip
def test_new_hybrid_families_layer_kinds(arch: str, kinds: list[str]) -> None:
    """Per-layer kinds of the families added with issue 16 (the hybrid ones' cache shapes are
    checked against a real forward by test_tiny_model_cache_matches_geometry, every one's by
    the adapter in tests/hf) and their presets."""
    g = ModelGeometry.from_hf_config(tiny_hf_config(arch))
    assert g.to_dict()["layers"] == kinds
    preset = get_preset({"lfm2_moe": "lfm2-8b-a1b", "olmo_hybrid": "olmo-hybrid-7b",
                         "zamba2": "zamba2-2.7b", "mamba": "mamba-2.8b",
                         "mamba2": "mamba-codestral-7b", "falcon_mamba": "falcon-mamba-7b"}[arch])
    assert preset.architecture == arch
    if arch in ("mamba", "mamba2", "falcon_mamba"):  # state-only: no KV at all
        assert not g.attention_layers and g.kv_bytes_per_token() == 0 and g.state_bytes() > 0


def test_kimi_linear_mla_geometry_bytes_and_flops() -> None:
    """MLA: the cache holds the 512-wide latent and the 64-wide rotary key per layer and
    token (not 32 heads of K and V); FLOPs follow the latent's per-head expansion."""
    g = get_preset("kimi-linear-48b-a3b")
    assert g.attention is not None and g.mla is not None
    assert g.kv_bytes_per_token() == 7 * (512 + 64) * 2
    assert [t.shape for t in kv_layout(g, 3).specs[:2]] == [(3, 1, 512), (3, 1, 64)]
    one, two = g.flops_saved(1000).attention, g.flops_saved(2000).attention
    assert 2 * one < two < 4 * one  # projections linear, scores quadratic in the tokens
    # without the MLA block the cache would be costed as plain attention over one 512-wide head
    plain = ModelGeometry(**{k: getattr(g, k) for k in (
        "name", "architecture", "hidden_size", "vocab_size", "layers", "attention", "gdn", "mlp",
        "moe", "dtype", "state_dtype")})
    assert plain.flops_saved(1000).attention != one
