"""Geometries of published hybrid models (shipped as data), and tiny transformers configs.

The presets are YAML files in ``hybrid_connector/presets/`` (package data), one per preset,
typed in from the models' published ``config.json`` files (no downloads are possible where
this runs); each file's comment says which fields it used. ``presets/index.yaml`` lists
their names in order. They are read through the same schema as any user geometry
(``ModelGeometry.from_dict``), so a broken preset fails like a broken user file, naming the
file and the key. ``get_preset(name)`` returns a :class:`ModelGeometry`; ``PRESETS`` lists
the names.

``tiny_hf_config(arch)`` (from ``model_tiny``, re-exported here) returns a small transformers
config of each supported family for CPU exactness tests.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.geometry.tiny import (
    EXTRA_TINY_ARCHS,
    MULTIMODAL_TINY_ARCHS,
    SSM_TINY_ARCHS,
    TINY_ARCHS,
    tiny_hf_config,
)

__all__ = [
    "EXTRA_TINY_ARCHS",
    "MULTIMODAL_TINY_ARCHS",
    "PRESETS",
    "SSM_TINY_ARCHS",
    "TINY_ARCHS",
    "get_preset",
    "load_geometry",
    "marconi_ref_params",
    "tiny_hf_config",
]

# ---------------------------------------------------------------------------------------------
# published configs

_DIR = resources.files("hybrid_connector") / "presets"


def _read(name: str) -> Any:
    return yaml.safe_load((_DIR / name).read_text(encoding="utf-8"))


PRESETS: tuple[str, ...] = tuple(_read("index.yaml")["presets"])


@functools.cache
def _preset(key: str) -> ModelGeometry:
    """The preset ``key`` (a name in ``PRESETS``) at tp_size 1. Cached: a geometry is
    immutable (its memo only caches derived figures), so callers may share one."""
    return ModelGeometry.from_dict(_read(f"{key}.yaml"), source=str(_DIR / f"{key}.yaml"))


def get_preset(name: str, *, tp_size: int = 1) -> ModelGeometry:
    """The preset geometry called ``name`` (case-insensitive; the HF repo id also works), at
    tensor-parallel size ``tp_size``. Unknown names raise ValueError listing the known ones."""
    key = name.strip().lower()
    if key not in PRESETS:
        key = next((k for k in PRESETS if _preset(k).name.lower() == key), "")
    if not key:
        raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)}")
    geom = _preset(key)
    if tp_size != 1:
        geom = ModelGeometry.from_dict({**geom.to_dict(), "tp_size": tp_size}, source=f"preset {name}")
    return geom


def load_geometry(spec: str, *, tp_size: int | None = None) -> ModelGeometry:
    """Resolve a config's ``model`` value: a path to a geometry YAML (``.yaml``/``.yml`` or an
    existing file) or a preset name. ``tp_size`` overrides the loaded value when given."""
    p = Path(spec).expanduser()
    if spec.endswith((".yaml", ".yml")) or p.is_file():
        geom = ModelGeometry.from_yaml(p)
    else:
        geom = get_preset(spec)
    if tp_size is not None and tp_size != geom.tp_size:
        geom = ModelGeometry.from_dict({**geom.to_dict(), "tp_size": tp_size}, source=spec)
    return geom


def marconi_ref_params(geom: ModelGeometry) -> dict[str, int]:
    """The scalars the reference simulator's formulas take (``ref_*`` in model.py): D, N (the
    recurrent state size, Mamba d_state or GDN head_k_dim), and the layer counts n_attn, n_ssm,
    n_mlp (MoE layers count as MLP)."""
    c = geom.layer_counts()
    if geom.mamba2 is not None:
        n = geom.mamba2.d_state
    elif geom.mamba1 is not None:
        n = geom.mamba1.d_state
    elif geom.gdn is not None:
        n = geom.gdn.head_k_dim
    else:
        n = 0
    return {
        "D": geom.hidden_size,
        "N": n,
        "n_attn": c["attention"],
        "n_ssm": len(geom.recurrent_layers),
        "n_mlp": c["mlp"] + c["moe"],
    }
