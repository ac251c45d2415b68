"""Model geometry for hybrid LLMs: layer kinds, dims, and the bytes and FLOPs per cached object.

A :class:`ModelGeometry` is the single engine-neutral description of a hybrid model that the
rest of the connector needs: which layers are attention and which are recurrent, how big one
token of KV is, how big one recurrent-state checkpoint is, how big an anchor is, and how many
FLOPs a cache hit avoids. It is built from a preset, a YAML/dict, or a transformers config.

Conventions (shared with vLLM's ``MambaStateShapeCalculator``, which is what the engine
integrations must match byte for byte):

* Conv state is stored as ``[channels, conv_kernel - 1]`` in ``dtype``: the last
  ``kernel - 1`` inputs are all a causal conv needs to continue. transformers' own cache keeps
  the full kernel width, and some vLLM backends keep the transpose ``[kernel - 1, channels]``;
  converting is the engine integration's concern, not this module's (the bytes are equal).
* Recurrent (SSM / delta-rule) state is stored in ``state_dtype`` (fp32 by default, as vLLM
  and SGLang do): Mamba2 ``[heads, head_dim, d_state]``, GDN ``[v_heads, head_k_dim,
  head_v_dim]``, Mamba1 ``[d_inner, d_state]``. Short conv has no recurrent state.
* Byte figures are per tensor-parallel rank. FLOP figures are whole-model (summed over ranks).
* Batch dims are never included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hybrid_connector.flops import (
    attention_layer_flops,
    gdn_layer_flops,
    mamba1_layer_flops,
    mamba2_layer_flops,
    mlp_layer_flops,
    moe_layer_flops,
    ref_attn_flops,
    ref_kv_bytes,
    ref_mamba_flops,
    ref_mlp_flops,
    ref_node_efficiency,
    ref_node_memory,
    ref_node_savings,
    ref_state_bytes,
    short_conv_layer_flops,
)
from hybrid_connector.layers import (
    AttentionDims,
    FFNKind,
    FlopBreakdown,
    GDNDims,
    LayerSpec,
    Mamba1Dims,
    Mamba2Dims,
    MixerKind,
    MLPDims,
    MoEDims,
    ShortConvDims,
    TensorSpec,
    canonical_dtype,
    dtype_bytes,
)

__all__ = [
    "AttentionDims",
    "FFNKind",
    "FlopBreakdown",
    "GDNDims",
    "LayerSpec",
    "MLPDims",
    "Mamba1Dims",
    "Mamba2Dims",
    "MixerKind",
    "ModelGeometry",
    "MoEDims",
    "ShortConvDims",
    "TensorSpec",
    "dtype_bytes",
    "ref_attn_flops",
    "ref_kv_bytes",
    "ref_mamba_flops",
    "ref_mlp_flops",
    "ref_state_bytes",
    "ref_node_efficiency",
    "ref_node_memory",
    "ref_node_savings",
]

# --------------------------------------------------------------------------------------------
# the geometry

_DIM_CLASSES: dict[str, type] = {
    "attention": AttentionDims,
    "mamba2": Mamba2Dims,
    "mamba1": Mamba1Dims,
    "gdn": GDNDims,
    "short_conv": ShortConvDims,
    "mlp": MLPDims,
    "moe": MoEDims,
}

# which dims block a mixer / FFN kind needs
_MIXER_NEEDS: dict[MixerKind, tuple[str, ...]] = {
    MixerKind.ATTENTION: ("attention",),
    MixerKind.MAMBA2: ("mamba2",),
    MixerKind.MAMBA1: ("mamba1",),
    MixerKind.GDN: ("gdn",),
    MixerKind.SHORT_CONV: ("short_conv",),
    MixerKind.HYBRID_PARALLEL: ("attention", "mamba2"),
    MixerKind.NONE: (),
}
_FFN_NEEDS: dict[FFNKind, tuple[str, ...]] = {
    FFNKind.MLP: ("mlp",),
    FFNKind.MOE: ("moe",),
    FFNKind.NONE: (),
}


def _divide(what: str, numerator: int, tp: int) -> int:
    if numerator % tp:
        raise ValueError(f"{what} = {numerator} is not divisible by tp_size = {tp}")
    return numerator // tp


@dataclass(frozen=True)
class ModelGeometry:
    """Geometry of a hybrid model, per tensor-parallel rank where bytes are concerned.

    ``layers`` must be indexed 0..n-1 in order. Every dims block a layer kind needs must be
    present (checked at construction, ValueError otherwise). ``dtype`` is the dtype of KV,
    conv state and hidden states (anchors); ``state_dtype`` that of recurrent state.
    """

    name: str
    architecture: str
    hidden_size: int
    vocab_size: int
    layers: tuple[LayerSpec, ...]
    attention: AttentionDims | None = None
    mamba2: Mamba2Dims | None = None
    gdn: GDNDims | None = None
    short_conv: ShortConvDims | None = None
    mlp: MLPDims | None = None
    moe: MoEDims | None = None
    dtype: str = "bfloat16"
    state_dtype: str = "float32"
    tp_size: int = 1
    mamba1: Mamba1Dims | None = None
    # Memo for the derived figures (the dataclass is frozen, so they never go stale); policies
    # query them per node on hot paths.
    _memo: dict[object, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Accept plain strings for kinds (YAML, hand-written presets); store enums.
        object.__setattr__(
            self,
            "layers",
            tuple(LayerSpec(x.index, MixerKind(x.mixer), FFNKind(x.ffn)) for x in self.layers),
        )
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        object.__setattr__(self, "state_dtype", canonical_dtype(self.state_dtype))
        if not self.layers:
            raise ValueError(f"{self.name}: a model needs at least one layer")
        if self.hidden_size <= 0 or self.vocab_size <= 0:
            raise ValueError(f"{self.name}: hidden_size and vocab_size must be positive")
        if self.tp_size < 1:
            raise ValueError(f"{self.name}: tp_size must be >= 1, got {self.tp_size}")
        for key in _DIM_CLASSES:
            dims = getattr(self, key)
            if dims is None:
                continue
            for f in fields(dims):
                v = getattr(dims, f.name)
                if isinstance(v, bool):
                    continue
                floor = 0 if f.name == "shared_intermediate_size" else 1
                if not isinstance(v, int) or v < floor:
                    raise ValueError(f"{self.name}: {key}.{f.name} must be an integer >= {floor}, got {v!r}")
        a = self.attention
        if a is not None and a.num_heads % a.num_kv_heads:
            raise ValueError(
                f"{self.name}: attention num_heads {a.num_heads} is not a multiple of "
                f"num_kv_heads {a.num_kv_heads}"
            )
        for i, layer in enumerate(self.layers):
            if layer.index != i:
                raise ValueError(f"{self.name}: layer at position {i} has index {layer.index}")
            for need in _MIXER_NEEDS[MixerKind(layer.mixer)] + _FFN_NEEDS[FFNKind(layer.ffn)]:
                if getattr(self, need) is None:
                    raise ValueError(
                        f"{self.name}: layer {i} ({layer.mixer.value}/{layer.ffn.value}) "
                        f"needs `{need}` dims, which are missing"
                    )
        # Fail at construction, not at first use, if the TP layout is impossible.
        self.state_layout()
        self.kv_layout(1)

    # ---- layer sets

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Indices of layers that hold KV (attention and parallel hybrid layers)."""
        return tuple(layer.index for layer in self.layers if layer.mixer.has_kv)

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        """Indices of layers that hold recurrent state (incl. parallel hybrid layers)."""
        return tuple(layer.index for layer in self.layers if layer.mixer.is_recurrent)

    def recurrent_groups(self) -> tuple[tuple[int, ...], ...]:
        """Maximal runs of recurrent layers not separated by an attention layer.

        FFN-only layers (mixer NONE) do not break a run. A parallel hybrid layer (Falcon-H1)
        needs attention over the prefix, so it is a group of its own: every Falcon-H1 layer is
        one group. Anchors store one hidden state per group per token.
        """
        memo = self._memo.get("groups")
        if memo is not None:
            return memo
        groups: list[tuple[int, ...]] = []
        run: list[int] = []
        for layer in self.layers:
            if layer.mixer == MixerKind.HYBRID_PARALLEL:
                if run:
                    groups.append(tuple(run))
                    run = []
                groups.append((layer.index,))
            elif layer.mixer == MixerKind.ATTENTION:
                if run:
                    groups.append(tuple(run))
                    run = []
            elif layer.mixer.is_recurrent:
                run.append(layer.index)
        if run:
            groups.append(tuple(run))
        self._memo["groups"] = tuple(groups)
        return tuple(groups)

    # ---- per-rank layouts and bytes

    def _kv_heads_per_rank(self) -> int:
        a = self.attention
        assert a is not None
        # vLLM: KV heads are sharded when divisible, replicated (one per rank) when fewer than TP.
        if a.num_kv_heads >= self.tp_size:
            return _divide("num_kv_heads", a.num_kv_heads, self.tp_size)
        if self.tp_size % a.num_kv_heads:
            raise ValueError(
                f"{self.name}: tp_size {self.tp_size} is not a multiple of num_kv_heads {a.num_kv_heads}"
            )
        return 1

    def kv_layout(self, num_tokens: int) -> tuple[TensorSpec, ...]:
        """Per attention layer, K then V, each ``[num_tokens, kv_heads_per_rank, head_dim]``
        in ``dtype``. Names are ``layers.{i}.k`` / ``layers.{i}.v``."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        idx = self.attention_layers
        if not idx:
            return ()
        assert self.attention is not None
        shape = (num_tokens, self._kv_heads_per_rank(), self.attention.head_dim)
        out: list[TensorSpec] = []
        for i in idx:
            out.append(TensorSpec(f"layers.{i}.k", shape, self.dtype))
            out.append(TensorSpec(f"layers.{i}.v", shape, self.dtype))
        return tuple(out)

    def kv_bytes_per_token(self) -> int:
        """K+V bytes of one token over all attention layers on one rank:
        ``2 * kv_heads_per_rank * head_dim * dtype_bytes`` per attention layer."""
        if "kv_bytes" not in self._memo:
            self._memo["kv_bytes"] = sum(t.nbytes for t in self.kv_layout(1))
        return int(self._memo["kv_bytes"])

    def _mixer_state(self, layer: LayerSpec) -> tuple[TensorSpec, ...]:
        i, tp = layer.index, self.tp_size
        conv_name, rec_name = f"layers.{i}.conv_state", f"layers.{i}.recurrent_state"
        mixer = layer.mixer
        if mixer in (MixerKind.MAMBA2, MixerKind.HYBRID_PARALLEL):
            m = self.mamba2
            assert m is not None
            # vLLM replicates a single B/C group across ranks (extra_groups_for_head_shards).
            groups = m.n_groups if m.n_groups % tp == 0 else tp
            if m.n_groups % tp and m.n_groups != 1:
                raise ValueError(f"{self.name}: mamba n_groups {m.n_groups} incompatible with tp {tp}")
            channels = m.d_inner + 2 * groups * m.d_state
            return (
                TensorSpec(conv_name, (_divide("mamba conv channels", channels, tp), m.conv_kernel - 1), self.dtype),
                TensorSpec(
                    rec_name,
                    (_divide("mamba num_heads", m.num_heads, tp), m.head_dim, m.d_state),
                    self.state_dtype,
                ),
            )
        if mixer == MixerKind.GDN:
            g = self.gdn
            assert g is not None
            return (
                TensorSpec(conv_name, (_divide("gdn conv channels", g.conv_channels, tp), g.conv_kernel - 1), self.dtype),
                TensorSpec(
                    rec_name,
                    (_divide("gdn num_v_heads", g.num_v_heads, tp), g.head_k_dim, g.head_v_dim),
                    self.state_dtype,
                ),
            )
        if mixer == MixerKind.MAMBA1:
            m1 = self.mamba1
            assert m1 is not None
            d_in = _divide("mamba d_inner", m1.d_inner, tp)
            return (
                TensorSpec(conv_name, (d_in, m1.conv_kernel - 1), self.dtype),
                TensorSpec(rec_name, (d_in, m1.d_state), self.state_dtype),
            )
        if mixer == MixerKind.SHORT_CONV:
            s = self.short_conv
            assert s is not None
            return (
                TensorSpec(conv_name, (_divide("hidden_size", self.hidden_size, tp), s.conv_kernel - 1), self.dtype),
            )
        return ()

    def state_layout(self) -> tuple[TensorSpec, ...]:
        """One state checkpoint on one rank: per recurrent layer, in layer order, its conv state
        ``[channels/tp, conv_kernel - 1]`` (``dtype``) then its recurrent state (``state_dtype``;
        absent for short conv). Names are ``layers.{i}.conv_state`` /
        ``layers.{i}.recurrent_state``."""
        out: list[TensorSpec] = []
        for layer in self.layers:
            out.extend(self._mixer_state(layer))
        return tuple(out)

    def state_bytes(self) -> int:
        """Bytes of one state checkpoint (all recurrent layers, conv + recurrent) on one rank."""
        if "state_bytes" not in self._memo:
            self._memo["state_bytes"] = sum(t.nbytes for t in self.state_layout())
        return int(self._memo["state_bytes"])

    def state_bytes_per_layer(self) -> dict[int, int]:
        """Checkpoint bytes split by recurrent layer index (per rank)."""
        return {
            layer.index: sum(t.nbytes for t in self._mixer_state(layer))
            for layer in self.layers
            if layer.mixer.is_recurrent
        }

    def anchor_bytes_per_token(self) -> int:
        """Bytes of one anchor token: one hidden state (``hidden_size`` in ``dtype``, replicated
        across TP ranks) per recurrent group."""
        return self.hidden_size * dtype_bytes(self.dtype) * len(self.recurrent_groups())

    # ---- FLOPs

    def flops_saved(self, num_tokens: int, prefix_tokens: int = 0) -> FlopBreakdown:
        """Whole-model FLOPs (all TP ranks) avoided by not recomputing the tokens
        ``[prefix_tokens, prefix_tokens + num_tokens)``: every layer's mixer and FFN over those
        tokens, with the attention score/value term summed over each token's full causal
        context. Embedding, lm_head, norms and rotary are not counted. See the
        ``*_layer_flops`` functions for exactly what each family counts."""
        if num_tokens < 0 or prefix_tokens < 0:
            raise ValueError(f"num_tokens and prefix_tokens must be >= 0, got {num_tokens}, {prefix_tokens}")
        key = ("flops", num_tokens, prefix_tokens)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        n, d = num_tokens, self.hidden_size
        acc = dict.fromkeys((f.name for f in fields(FlopBreakdown)), 0.0)
        counts = self.layer_counts()
        if self.attention is not None:
            acc["attention"] = counts["attention"] * attention_layer_flops(self.attention, d, n, prefix_tokens)
        if self.mamba2 is not None:
            acc["mamba2"] = counts["mamba2"] * mamba2_layer_flops(self.mamba2, d, n)
        if self.mamba1 is not None:
            acc["mamba1"] = counts["mamba1"] * mamba1_layer_flops(self.mamba1, d, n)
        if self.gdn is not None:
            acc["gdn"] = counts["gdn"] * gdn_layer_flops(self.gdn, d, n)
        if self.short_conv is not None:
            acc["short_conv"] = counts["short_conv"] * short_conv_layer_flops(self.short_conv, d, n)
        if self.mlp is not None:
            acc["mlp"] = counts["mlp"] * mlp_layer_flops(self.mlp, d, n)
        if self.moe is not None:
            acc["moe"] = counts["moe"] * moe_layer_flops(self.moe, d, n)
        result = FlopBreakdown(**acc)
        if len(self._memo) < 4096:  # bounded: policies ask the same lengths repeatedly
            self._memo[key] = result
        return result

    def layer_counts(self) -> dict[str, int]:
        """How many layers carry each family (a parallel hybrid layer counts for attention and
        mamba2)."""
        c = dict.fromkeys(("attention", "mamba2", "mamba1", "gdn", "short_conv", "mlp", "moe"), 0)
        for layer in self.layers:
            for need in _MIXER_NEEDS[layer.mixer] + _FFN_NEEDS[layer.ffn]:
                c[need] += 1
        return c

    # ---- identity and (de)serialisation

    def fingerprint_fields(self) -> dict[str, object]:
        """Everything about geometry, dtypes and TP layout that changes what a stored object
        means or how big it is. ``name`` is deliberately excluded (the same model reached via
        two engines must share objects); weight identity (model id, revision) is the key
        builder's concern."""
        d = self.to_dict()
        d.pop("name")
        return d

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON/YAML-safe). Layers are ``"mixer+ffn"`` strings in order."""
        out: dict[str, Any] = {
            "name": self.name,
            "architecture": self.architecture,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "layers": [f"{layer.mixer.value}+{layer.ffn.value}" for layer in self.layers],
        }
        for key, cls in _DIM_CLASSES.items():
            dims = getattr(self, key)
            if dims is not None:
                out[key] = {f.name: getattr(dims, f.name) for f in fields(cls)}
        out["dtype"] = self.dtype
        out["state_dtype"] = self.state_dtype
        out["tp_size"] = self.tp_size
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "geometry") -> ModelGeometry:
        """Inverse of :meth:`to_dict`. Layers may be ``"mixer+ffn"`` strings or
        ``{"mixer": ..., "ffn": ...}`` mappings. Raises ValueError naming ``source`` and the
        offending key for unknown keys, missing keys and bad values."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{source}: expected a mapping, got {type(d).__name__}")
        allowed = {"name", "architecture", "hidden_size", "vocab_size", "layers", "dtype", "state_dtype", "tp_size"}
        allowed |= set(_DIM_CLASSES)
        for key in d:
            if key not in allowed:
                raise ValueError(f"{source}: unknown key {key!r}; allowed: {sorted(allowed)}")
        for key in ("name", "architecture", "hidden_size", "vocab_size", "layers"):
            if key not in d:
                raise ValueError(f"{source}: missing required key {key!r}")
        kwargs: dict[str, Any] = {}
        for key in ("name", "architecture", "dtype", "state_dtype"):
            if key in d:
                if not isinstance(d[key], str):
                    raise ValueError(f"{source}: key {key!r} must be a string, got {d[key]!r}")
                kwargs[key] = d[key]
        for key in ("hidden_size", "vocab_size", "tp_size"):
            if key in d:
                kwargs[key] = _as_int(d[key], f"{source}: key {key!r}")
        kwargs["layers"] = _parse_layers(d["layers"], source)
        for key, dim_cls in _DIM_CLASSES.items():
            if d.get(key) is not None:
                kwargs[key] = _parse_dims(dim_cls, d[key], f"{source}: key {key!r}")
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from e

    @classmethod
    def from_yaml(cls, path: str | Path) -> ModelGeometry:
        """Load a geometry written as the :meth:`to_dict` mapping, optionally nested under a
        top-level ``model:`` key. Errors name the file and the bad key."""
        import yaml

        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text())
        except OSError as e:
            raise ValueError(f"{p}: cannot read model geometry: {e}") from e
        except yaml.YAMLError as e:
            raise ValueError(f"{p}: invalid YAML: {e}") from e
        if isinstance(data, Mapping) and set(data) == {"model"}:
            data = data["model"]
        return cls.from_dict(data, source=str(p))

    @classmethod
    def from_hf_config(
        cls,
        cfg: Any,
        *,
        name: str | None = None,
        dtype: str | None = None,
        state_dtype: str | None = None,
        tp_size: int = 1,
    ) -> ModelGeometry:
        """Build from a transformers config object (Qwen3.5 text or multimodal wrapper,
        Qwen3.5-MoE, Qwen3-Next, Nemotron-H, Bamba, Jamba, Falcon-H1, GraniteMoeHybrid, LFM2).
        ``dtype`` defaults to the config's ``dtype`` (else bfloat16); ``state_dtype`` to the
        config's mamba SSM cache dtype where it has one (else float32). Raises ValueError for
        an unsupported ``model_type``."""
        from hybrid_connector.model_hf import geometry_kwargs_from_hf  # lazy: optional path

        kw = geometry_kwargs_from_hf(cfg)
        if name is not None:
            kw["name"] = name
        if dtype is not None:
            kw["dtype"] = dtype
        if state_dtype is not None:
            kw["state_dtype"] = state_dtype
        kw["tp_size"] = tp_size
        return cls(**kw)


def _as_int(v: object, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{where} must be an integer, got {v!r}")
    return v


def _parse_layers(raw: object, source: str) -> tuple[LayerSpec, ...]:
    if not isinstance(raw, list | tuple) or not raw:
        raise ValueError(f"{source}: key 'layers' must be a non-empty list")
    out: list[LayerSpec] = []
    for i, item in enumerate(raw):
        where = f"{source}: key 'layers[{i}]'"
        if isinstance(item, str):
            mixer_s, sep, ffn_s = item.partition("+")
            if not sep:
                raise ValueError(f"{where}: expected 'mixer+ffn', got {item!r}")
        elif isinstance(item, Mapping):
            extra = set(item) - {"mixer", "ffn", "index"}
            if extra:
                raise ValueError(f"{where}: unknown key(s) {sorted(extra)}")
            mixer_s, ffn_s = item.get("mixer", "none"), item.get("ffn", "none")
        else:
            raise ValueError(f"{where}: expected 'mixer+ffn' or a mapping, got {item!r}")
        try:
            mixer = MixerKind(mixer_s)
        except ValueError:
            raise ValueError(f"{where}: unknown mixer {mixer_s!r}; known: {[m.value for m in MixerKind]}") from None
        try:
            ffn = FFNKind(ffn_s)
        except ValueError:
            raise ValueError(f"{where}: unknown ffn {ffn_s!r}; known: {[f.value for f in FFNKind]}") from None
        out.append(LayerSpec(i, mixer, ffn))
    return tuple(out)


def _parse_dims(dim_cls: type, raw: object, where: str) -> Any:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be a mapping, got {raw!r}")
    names = {f.name: f for f in fields(dim_cls)}
    for k in raw:
        if k not in names:
            raise ValueError(f"{where}: unknown key {k!r}; allowed: {sorted(names)}")
    kwargs: dict[str, Any] = {}
    for fname, f in names.items():
        if fname not in raw:
            if f.default is f.default_factory:  # both MISSING: a required field
                raise ValueError(f"{where}: missing key {fname!r}")
            continue
        v = raw[fname]
        if isinstance(f.default, bool):
            if not isinstance(v, bool):
                raise ValueError(f"{where}.{fname} must be a boolean, got {v!r}")
            kwargs[fname] = v
        else:
            kwargs[fname] = _as_int(v, f"{where}.{fname}")
            if kwargs[fname] < 0:
                raise ValueError(f"{where}.{fname} must be >= 0, got {v!r}")
    return dim_cls(**kwargs)


