"""One validated configuration schema: LMCache-style keys plus the hybrid keys.

Sources, later ones win: defaults, the YAML file (``path`` argument or the
``HYBRID_CONNECTOR_CONFIG`` env var), then ``HYBRID_CONNECTOR_<KEY>`` env vars (nested keys
joined by ``__``, e.g. ``HYBRID_CONNECTOR_POOLS__HOST__STATE=2GiB``; values are parsed as
YAML scalars). Unknown keys, wrong types and impossible combinations raise ``ConfigError``
naming the key and the file. Sizes accept ``5GB`` (10^9), ``512MiB`` (2^20), ``1.5 GiB`` or
a bare number: GB for the LMCache keys ``max_local_cpu_size``/``max_local_disk_size`` (their
LMCache meaning), bytes everywhere else.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

ENV_PATH = "HYBRID_CONNECTOR_CONFIG"
ENV_PREFIX = "HYBRID_CONNECTOR_"

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


class ConfigError(ValueError):
    """A configuration problem; the message names the key and the source file."""


def parse_size(value: object, bare_unit: int = 1) -> int:
    """Bytes from ``5GB``/``512MiB``/a number (a bare number is multiplied by ``bare_unit``)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"size must be >= 0, got {value}")
        return int(value * bare_unit)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2).lower() in _UNITS:
            unit = _UNITS[m.group(2).lower()] if m.group(2) else bare_unit
            return int(float(m.group(1)) * unit)
    raise ValueError(f"expected a size such as '5GB' or '512MiB', got {value!r}")


Bytes = Annotated[int, BeforeValidator(lambda v: parse_size(v))]
GBytes = Annotated[int, BeforeValidator(lambda v: parse_size(v, 10**9))]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PoolBudget(_Strict):
    """Byte budgets of one tier, one pool per object kind (0 disables that pool)."""

    kv: Bytes = 0
    state: Bytes = 0
    anchor: Bytes = 0

    @property
    def total(self) -> int:
        return self.kv + self.state + self.anchor


class Pools(_Strict):
    """Per-tier pool budgets. ``None`` means "derive from the LMCache size keys"."""

    device: PoolBudget | None = None
    host: PoolBudget | None = None
    disk: PoolBudget | None = None
    remote: PoolBudget | None = None


TIERS = ("device", "host", "disk", "remote")
# Default split of a tier's total when only an LMCache size key is given.
DEFAULT_SPLIT = {"kv": 0.6, "state": 0.3, "anchor": 0.1}


class HybridConfig(_Strict):
    """The whole configuration. Immutable; build with ``load_config``."""

    # --- LMCache-compatible keys ---
    chunk_size: int = Field(256, gt=0)
    local_cpu: bool = True
    max_local_cpu_size: GBytes = 5 * 10**9
    local_disk: str | None = None
    max_local_disk_size: GBytes = 0
    remote_url: str | None = None
    remote_serde: Literal["naive", "zstd"] = "naive"
    save_decode_cache: bool = False
    use_layerwise: bool = False
    # --- hybrid keys ---
    model: str | None = None  # preset name or path to a model geometry YAML
    hash_block_size: int = Field(16, gt=0)
    alignment: int = Field(16, gt=0)  # engine alignment of usable hit lengths (tokens)
    device_size: Bytes = 0
    pools: Pools = Pools()
    admission: Literal["marconi", "every_block", "last_token"] = "marconi"
    eviction: Literal["lru", "marconi", "marconi_reference"] = "marconi"
    alpha: float | Literal["auto"] = "auto"
    alpha_objective: Literal["flops", "token_hits"] = "flops"
    alpha_grid: tuple[float, ...] = Field(
        tuple(round(0.1 * i, 1) for i in range(21)), strict=False, min_length=1
    )
    bootstrap_multiplier: int = Field(5, gt=0)
    retune_interval: int = Field(500, ge=0)
    placement_slots: int = Field(0, ge=0)  # checkpoint slots per long shared prefix
    placement_bin: int = Field(64, gt=0)
    placement_decay: float = Field(0.99, gt=0.0, le=1.0)
    anchor_page_size: int = Field(64, gt=0)
    anchor_density: float = Field(0.25, ge=0.0, le=1.0)
    replay: bool = False
    replay_budget_frac: float = Field(0.05, gt=0.0, le=1.0)
    replay_max_tokens: int = Field(2048, gt=0)
    replay_max_kl: float = Field(0.05, ge=0.0)
    replay_min_top1: float = Field(0.9, ge=0.0, le=1.0)
    lookup_timeout_ms: int = Field(3000, gt=0)
    extra_config: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _combinations(self) -> HybridConfig:
        if self.chunk_size % self.hash_block_size:
            raise ValueError(
                f"chunk_size ({self.chunk_size}) must be a multiple of hash_block_size "
                f"({self.hash_block_size})"
            )
        if self.local_disk and self.max_local_disk_size == 0 and self.pools.disk is None:
            raise ValueError("local_disk is set but max_local_disk_size is 0")
        if self.max_local_disk_size and not self.local_disk:
            raise ValueError("max_local_disk_size is set but local_disk is not")
        if self.replay and self.anchor_density == 0.0:
            raise ValueError("replay is on but anchor_density is 0: no anchors to replay from")
        if isinstance(self.alpha, float) and self.alpha < 0:
            raise ValueError(f"alpha must be >= 0 or 'auto', got {self.alpha}")
        if self.eviction == "lru" and self.alpha != "auto" and self.alpha != 0.0:
            raise ValueError("alpha is only meaningful with eviction 'marconi'")
        host = self.pools.host
        if host is not None and self.local_cpu and host.total > self.max_local_cpu_size:
            raise ValueError(
                f"pools.host ({host.total} B) exceeds max_local_cpu_size "
                f"({self.max_local_cpu_size} B)"
            )
        return self

    def budget(self, tier: str) -> PoolBudget:
        """Effective per-kind budget of ``tier`` (explicit pools win over LMCache size keys)."""
        if tier not in TIERS:
            raise ValueError(f"unknown tier {tier!r}; known: {TIERS}")
        explicit: PoolBudget | None = getattr(self.pools, tier)
        if explicit is not None:
            return explicit
        total = {
            "device": self.device_size,
            "host": self.max_local_cpu_size if self.local_cpu else 0,
            "disk": self.max_local_disk_size if self.local_disk else 0,
            "remote": 0,
        }[tier]
        return PoolBudget(**{k: int(total * f) for k, f in DEFAULT_SPLIT.items()})

    @property
    def disk_path(self) -> str | None:
        """``local_disk`` without a ``file://`` prefix."""
        if self.local_disk is None:
            return None
        return self.local_disk.removeprefix("file://")


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_PATH:
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = yaml.safe_load(raw) if raw.strip() else None
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> HybridConfig:
    """Load and validate the configuration.

    ``path`` wins over ``HYBRID_CONNECTOR_CONFIG``; with neither, defaults are used. Env
    overrides apply on top, then ``overrides``. Raises ``ConfigError`` naming the key and
    file for unknown keys, wrong types, bad sizes and impossible combinations, and for an
    unreadable or non-mapping file.
    """
    env = os.environ if environ is None else environ
    source = str(path) if path is not None else env.get(ENV_PATH)
    data: dict[str, Any] = {}
    if source:
        try:
            loaded = yaml.safe_load(Path(source).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{source}: cannot read config: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{source}: top level must be a mapping, got {type(loaded).__name__}")
        data = loaded or {}
    data = _merge(data, _env_overrides(env))
    if overrides:
        data = _merge(data, overrides)
    where = source or "<defaults+env>"
    try:
        return HybridConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"]) or "<root>"
            problems.append(f"{where}: key '{key}': {err['msg']}")
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems)) from None
