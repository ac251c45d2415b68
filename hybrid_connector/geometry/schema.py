"""The plain-data form of a ``ModelGeometry`` (YAML, JSON, the shipped presets), as a schema.

What :meth:`ModelGeometry.to_dict` writes and :meth:`ModelGeometry.from_dict` reads:

* ``name``, ``architecture`` (strings), ``hidden_size``, ``vocab_size`` (integers) and
  ``layers`` (a non-empty list) are required; ``dtype``, ``state_dtype`` (strings) and
  ``tp_size`` (an integer) are optional.
* Each ``layers`` item is a ``"mixer+ffn"`` string (``"gdn+mlp"``) or a mapping
  ``{mixer, ffn}`` whose missing kinds are ``"none"``; an ``index`` key there is accepted
  and ignored (a layer's index is its position).
* One optional mapping per dims block (:data:`DIM_CLASSES`: ``attention``, ``mamba2``...);
  ``null`` means absent. Dims are integers >= 0 or, for flags, booleans.

Validation is strict in the style of ``config.py``: no coercion (``"4"``, ``4.0`` and
``true`` are not integers), unknown keys are errors, and every error names the source and
the offending key (``layers[3]``, ``gdn.conv_kernel``). Omitted optional keys are not
passed on, so ``ModelGeometry``'s own defaults apply; which values make sense together
(dims >= 1, the dims a layer kind needs, the TP layout) is ``ModelGeometry``'s check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
)

from hybrid_connector.geometry.layers import (
    AttentionDims,
    FFNKind,
    GDNDims,
    LayerSpec,
    Mamba1Dims,
    Mamba2Dims,
    MixerKind,
    MLADims,
    MLPDims,
    MoEDims,
    ShortConvDims,
)

# The dims blocks, by the key they are written under (also ModelGeometry's field names).
DIM_CLASSES: dict[str, type] = {
    "attention": AttentionDims,
    "mla": MLADims,
    "mamba2": Mamba2Dims,
    "mamba1": Mamba1Dims,
    "gdn": GDNDims,
    "short_conv": ShortConvDims,
    "mlp": MLPDims,
    "moe": MoEDims,
}

# Which dims blocks a mixer / FFN kind needs.
MIXER_NEEDS: dict[MixerKind, tuple[str, ...]] = {
    MixerKind.ATTENTION: ("attention",),
    MixerKind.MAMBA2: ("mamba2",),
    MixerKind.MAMBA1: ("mamba1",),
    MixerKind.GDN: ("gdn",),
    MixerKind.SHORT_CONV: ("short_conv",),
    MixerKind.HYBRID_PARALLEL: ("attention", "mamba2"),
    MixerKind.NONE: (),
}
FFN_NEEDS: dict[FFNKind, tuple[str, ...]] = {
    FFNKind.MLP: ("mlp",),
    FFNKind.MOE: ("moe",),
    FFNKind.NONE: (),
}


def _optional() -> Any:
    # An optional key with no default of its own: left unset, it is not passed on and the
    # dataclass default applies (None is never passed on: strict types reject it).
    return Field(default=None)


Dim = Annotated[int, Field(ge=0)]  # >= 1 is ModelGeometry's check (it names the field)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class AttentionSchema(_Strict):
    num_heads: Dim
    num_kv_heads: Dim
    head_dim: Dim
    output_gate: bool = _optional()
    v_head_dim: Dim = _optional()


class MLASchema(_Strict):
    kv_lora_rank: Dim
    qk_nope_head_dim: Dim
    qk_rope_head_dim: Dim
    v_head_dim: Dim
    q_lora_rank: Dim = _optional()


class Mamba2Schema(_Strict):
    num_heads: Dim
    head_dim: Dim
    d_state: Dim
    n_groups: Dim
    conv_kernel: Dim


class Mamba1Schema(_Strict):
    d_inner: Dim
    d_state: Dim
    conv_kernel: Dim
    dt_rank: Dim


class GDNSchema(_Strict):
    num_k_heads: Dim
    num_v_heads: Dim
    head_k_dim: Dim
    head_v_dim: Dim
    conv_kernel: Dim


class ShortConvSchema(_Strict):
    conv_kernel: Dim


class MLPSchema(_Strict):
    intermediate_size: Dim
    gated: bool = _optional()


class MoESchema(_Strict):
    num_experts: Dim
    top_k: Dim
    expert_intermediate_size: Dim
    shared_intermediate_size: Dim
    gated: bool = _optional()


DIM_SCHEMAS: dict[str, type[_Strict]] = {
    "attention": AttentionSchema,
    "mla": MLASchema,
    "mamba2": Mamba2Schema,
    "mamba1": Mamba1Schema,
    "gdn": GDNSchema,
    "short_conv": ShortConvSchema,
    "mlp": MLPSchema,
    "moe": MoESchema,
}


def _check_in_sync() -> None:
    """Each dims schema has exactly its dataclass's fields, required exactly where the
    dataclass has no default (so a field added to ``layers`` cannot be silently dropped)."""
    for key, cls in DIM_CLASSES.items():
        want = {f.name: f.default is MISSING and f.default_factory is MISSING for f in fields(cls)}
        got = {n: f.is_required() for n, f in DIM_SCHEMAS[key].model_fields.items()}
        if want != got:
            raise RuntimeError(f"geometry schema for {key!r} is out of sync with {cls.__name__}")


_check_in_sync()


def _layer(item: object) -> tuple[MixerKind, FFNKind]:
    """One ``layers`` item -> (mixer, ffn); ValueError saying what is wrong with it."""
    if isinstance(item, str):
        mixer_s, sep, ffn_s = item.partition("+")
        if not sep:
            raise ValueError(f"expected 'mixer+ffn', got {item!r}")
    elif isinstance(item, Mapping):
        extra = set(item) - {"mixer", "ffn", "index"}
        if extra:
            raise ValueError(f"unknown key(s) {sorted(extra)}")
        mixer_s, ffn_s = item.get("mixer", "none"), item.get("ffn", "none")
    else:
        raise ValueError(f"expected 'mixer+ffn' or a mapping, got {item!r}")
    try:
        mixer = MixerKind(mixer_s)
    except ValueError:
        raise ValueError(f"unknown mixer {mixer_s!r}; known: {[m.value for m in MixerKind]}") from None
    try:
        ffn = FFNKind(ffn_s)
    except ValueError:
        raise ValueError(f"unknown ffn {ffn_s!r}; known: {[f.value for f in FFNKind]}") from None
    return mixer, ffn


def _layer_list(raw: object) -> object:
    if isinstance(raw, tuple):  # Python callers may pass a tuple; strict lists want a list
        raw = list(raw)
    if not isinstance(raw, list) or not raw:
        raise ValueError("must be a non-empty list")
    return raw


LayerKinds = Annotated[tuple[MixerKind, FFNKind], PlainValidator(_layer)]


class GeometrySchema(_Strict):
    """The whole mapping (see the module docstring)."""

    name: str
    architecture: str
    hidden_size: int
    vocab_size: int
    layers: Annotated[list[LayerKinds], BeforeValidator(_layer_list)]
    dtype: str = _optional()
    state_dtype: str = _optional()
    tp_size: int = _optional()
    attention: AttentionSchema | None = None
    mla: MLASchema | None = None
    mamba2: Mamba2Schema | None = None
    mamba1: Mamba1Schema | None = None
    gdn: GDNSchema | None = None
    short_conv: ShortConvSchema | None = None
    mlp: MLPSchema | None = None
    moe: MoESchema | None = None

    def geometry_kwargs(self) -> dict[str, Any]:
        """``ModelGeometry`` constructor arguments: the keys given, dims as dataclasses,
        layers as ``LayerSpec`` indexed by position."""
        given = self.model_fields_set - set(DIM_SCHEMAS) - {"layers"}
        kw: dict[str, Any] = {k: getattr(self, k) for k in given}
        kw["layers"] = tuple(LayerSpec(i, m, f) for i, (m, f) in enumerate(self.layers))
        for key, cls in DIM_CLASSES.items():
            dims = getattr(self, key)
            if dims is not None:
                kw[key] = cls(**dims.model_dump(exclude_unset=True))
        return kw


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_TYPE_WORDS = {
    "int_type": "an integer",
    "string_type": "a string",
    "bool_type": "a boolean",
    "model_type": "a mapping",
    "dict_type": "a mapping",
}


def _problem(err: Mapping[str, Any]) -> str:
    """One pydantic error as ``key 'x.y': what is wrong`` (the key path first)."""
    loc, kind = tuple(err["loc"]), err["type"]
    if kind in ("extra_forbidden", "missing"):
        *parent, key = loc
        where = f"key {_path(parent)!r}: " if parent else ""
        if kind == "missing":
            return f"{where}missing required key {key!r}"
        schema = DIM_SCHEMAS.get(str(parent[0])) if parent else GeometrySchema
        allowed = sorted(schema.model_fields) if schema is not None else []
        return f"{where}unknown key {key!r}; allowed: {allowed}"
    path = _path(loc)
    if kind in _TYPE_WORDS:
        return f"key {path!r} must be {_TYPE_WORDS[kind]}, got {err.get('input')!r}"
    if kind == "greater_than_equal":
        return f"key {path!r} must be >= {err['ctx']['ge']}, got {err.get('input')!r}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"key {path!r}{' ' if msg.startswith('must ') else ': '}{msg}"


def parse_geometry(data: object, source: str) -> dict[str, Any]:
    """Validate ``data`` (the mapping form) and return ``ModelGeometry``'s constructor
    arguments. Raises ValueError naming ``source`` and the offending key, one line per
    problem found."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: expected a mapping, got {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):  # pydantic would only say "Keys should be strings"
            raise ValueError(f"{source}: unknown key {key!r}; allowed: {sorted(GeometrySchema.model_fields)}")
    try:
        schema = GeometrySchema.model_validate(dict(data))
    except ValidationError as exc:
        raise ValueError("\n".join(f"{source}: {_problem(e)}" for e in exc.errors())) from None
    return schema.geometry_kwargs()


def read_geometry_yaml(path: Path) -> object:
    """The geometry mapping of a YAML file, unwrapped from a top-level ``model:`` key when
    that is the only key. Raises ValueError naming the file when it cannot be read or
    parsed (what it holds is :func:`parse_geometry`'s concern)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ValueError(f"{path}: cannot read model geometry: {e}") from e
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: invalid YAML: {e}") from e
    if isinstance(data, Mapping) and set(data) == {"model"}:
        data = data["model"]
    return data
