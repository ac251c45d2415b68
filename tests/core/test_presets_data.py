"""The shipped presets are data: every file is listed, loads through the schema, round-trips,
and is reachable by its name and its HF repo id."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.geometry.presets import PRESETS, get_preset

PRESET_DIR = resources.files("hybrid_connector") / "presets"


def test_index_lists_exactly_the_preset_files() -> None:
    files = {p.name.removesuffix(".yaml") for p in PRESET_DIR.iterdir() if p.name.endswith(".yaml")}
    assert files - {"index"} == set(PRESETS)
    assert len(PRESETS) == len(set(PRESETS))


@pytest.mark.parametrize("name", PRESETS)
def test_preset_file_is_a_plain_geometry(name: str) -> None:
    data = yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text())
    g = ModelGeometry.from_dict(data, source=name)
    assert g == get_preset(name) == get_preset(g.name) == get_preset(f"  {g.name.upper()} ")
    assert "tp_size" not in data  # the caller's choice, never the preset's
    assert {k: v for k, v in g.to_dict().items() if k != "tp_size"} == data


def test_tp_size_is_applied_on_top_and_errors_name_the_preset() -> None:
    assert get_preset("bamba-9b", tp_size=4).tp_size == 4
    assert get_preset("bamba-9b").tp_size == 1
    with pytest.raises(ValueError, match="preset qwen3.5-4b: .*divisible"):
        get_preset("qwen3.5-4b", tp_size=3)
