"""The geometry schema: strict types, unknown keys, and errors that name the source and the
key path (``layers[i]``, ``block.field``), one line per problem."""

from __future__ import annotations

from typing import Any

import pytest

from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.geometry.schema import DIM_CLASSES, DIM_SCHEMAS, parse_geometry


def base() -> dict[str, Any]:
    return get_preset("jamba-1.5-mini").to_dict()


@pytest.mark.parametrize(("patch", "message"), [
    ({"mlp": {"intermediate_size": 3.0}}, r"key 'mlp.intermediate_size' must be an integer, got 3.0"),
    ({"mlp": {"intermediate_size": True}}, r"key 'mlp.intermediate_size' must be an integer, got True"),
    ({"mlp": {"intermediate_size": "7"}}, r"key 'mlp.intermediate_size' must be an integer, got '7'"),
    ({"mlp": {"intermediate_size": -1}}, r"key 'mlp.intermediate_size' must be >= 0, got -1"),
    ({"mlp": {"intermediate_size": 8, "gated": 1}}, r"key 'mlp.gated' must be a boolean, got 1"),
    ({"mlp": {"gated": True}}, r"key 'mlp': missing required key 'intermediate_size'"),
    ({"mlp": [1]}, r"key 'mlp' must be a mapping, got \[1\]"),
    ({"layers": []}, r"key 'layers' must be a non-empty list"),
    ({"layers": "mamba1+mlp"}, r"key 'layers' must be a non-empty list"),
    ({"layers": ["mamba1+mlp", 4]}, r"key 'layers\[1\]': expected 'mixer\+ffn' or a mapping, got 4"),
    ({"layers": [{"mixer": "mamba1", "kind": "x"}]}, r"key 'layers\[0\]': unknown key\(s\) \['kind'\]"),
    ({"layers": ["mamba1+dense"]}, r"key 'layers\[0\]': unknown ffn 'dense'"),
    ({"tp_size": "2"}, r"key 'tp_size' must be an integer, got '2'"),
    ({"dtype": None}, r"key 'dtype' must be a string, got None"),
    ({7: 1}, r"unknown key 7; allowed: \["),
])  # fmt: skip
def test_errors_name_source_and_key_path(patch: dict[Any, Any], message: str) -> None:
    with pytest.raises(ValueError, match=rf"^SRC: {message}") as ei:
        ModelGeometry.from_dict({**base(), **patch}, source="SRC")
    assert ei.value.__cause__ is None  # the message says it all; no pydantic dump


def test_every_problem_is_reported_on_its_own_line() -> None:
    bad = {**base(), "hidden_size": "x", "hiden": 1, "moe": {"top_k": 2}}
    with pytest.raises(ValueError) as ei:
        ModelGeometry.from_dict(bad, source="f.yaml")
    lines = str(ei.value).splitlines()
    assert all(line.startswith("f.yaml: ") for line in lines)
    assert any("key 'hidden_size' must be an integer" in line for line in lines)
    assert any("unknown key 'hiden'" in line for line in lines)
    assert sum("key 'moe': missing required key" in line for line in lines) == 3


def test_omitted_optional_keys_take_the_dataclass_defaults() -> None:
    d = base()
    for key in ("dtype", "state_dtype", "tp_size"):
        d.pop(key)
    d["attention"].pop("output_gate")
    d["mlp"].pop("gated")
    kw = parse_geometry(d, "src")
    assert not {"dtype", "state_dtype", "tp_size"} & set(kw)
    g = ModelGeometry(**kw)
    assert (g.dtype, g.state_dtype, g.tp_size) == ("bfloat16", "float32", 1)
    assert g.attention is not None and g.attention.output_gate is False
    assert g.mlp is not None and g.mlp.gated is True
    assert g == get_preset("jamba-1.5-mini")


def test_layers_accept_mappings_and_tuples_and_ignore_a_given_index() -> None:
    d = base()
    as_maps = [dict(zip(("mixer", "ffn"), x.split("+"), strict=True), index=99) for x in d["layers"]]
    assert ModelGeometry.from_dict({**d, "layers": as_maps}) == get_preset("jamba-1.5-mini")
    assert ModelGeometry.from_dict({**d, "layers": tuple(d["layers"])}) == get_preset("jamba-1.5-mini")
    only_mixer = ModelGeometry.from_dict({**d, "layers": [{"mixer": "mamba1"}]})
    assert only_mixer.layers[0].ffn.value == "none"


def test_dims_schemas_mirror_the_dataclasses() -> None:
    assert set(DIM_SCHEMAS) == set(DIM_CLASSES)
    for key, cls in DIM_CLASSES.items():
        assert set(DIM_SCHEMAS[key].model_fields) == set(cls.__dataclass_fields__), key
