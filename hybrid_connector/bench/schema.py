"""The capacity benchmark's config: one validated schema, its defaults the embedded default.

``configs/capacity-cpu.yaml`` spells the defaults out (a test holds them equal), so
``hybrid-connector bench capacity`` with no ``--config`` runs exactly that file. A YAML
file holds the section under a top-level ``capacity:`` key. Unknown keys and wrong types
fail with ``ConfigError`` naming the key and the file, as ``hybrid_connector.core.config`` does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hybrid_connector.core.config import ConfigError

Configuration = Literal[
    "none", "device-lru", "device-ours", "device+host-lru", "device+host-ours",
    "device+host+nvme-lru", "device+host+nvme-ours", "vllm-block",
]
CONFIGURATIONS: tuple[Configuration, ...] = (
    "none", "device-lru", "device-ours", "device+host-lru", "device+host-ours",
    "device+host+nvme-lru", "device+host+nvme-ours", "vllm-block",
)
LOAD_TIERS = ("device", "host", "nvme")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkloadSpec(_Strict):
    """One multi-session workload (fixed seed). ``agentic``: SWE-bench-like agents
    (``sim.traces.agentic``) with retries (branches) and side calls; ``chat``: multi-turn
    chat whose users regenerate or edit a turn with ``branch_prob`` (a branch)."""

    name: str
    kind: Literal["agentic", "chat"]
    sessions: int = Field(gt=0)
    turns: int = Field(gt=0)
    seed: int = 0
    tokens_scale: float = Field(default=1.0, gt=0.0, le=1.0)  # every length times this
    retry_prob: float = Field(default=0.15, ge=0.0, lt=1.0)  # agentic: backtrack and branch
    side_calls: float = Field(default=0.5, ge=0.0)  # agentic: mean one-shot side calls per turn
    keep_last: int = Field(default=1000, ge=1)  # agentic: observations kept in full (5: SWE-agent's collapse)
    sessions_per_second: float = Field(default=0.5, gt=0.0)  # agentic: session arrivals
    branch_prob: float = Field(default=0.3, ge=0.0, lt=1.0)  # chat: regenerate/edit a turn
    max_input: int = Field(default=32768, gt=0)


class RealSpec(_Strict):
    """``compute: real``: the transformers model that runs prefill on this machine."""

    model: Literal["trained", "random"] = "trained"  # shipped trained tiny Qwen3.5 or random
    # the model runs every prefill on this machine: workloads shrink to at most ``sessions``
    # sessions with every length times ``tokens_scale`` (on top of the workload's own)
    sessions: int = Field(default=3, gt=0)
    tokens_scale: float = Field(default=0.05, gt=0.0, le=1.0)


class CapacityConfig(_Strict):
    """Everything the capacity sweep needs (see the module docstring and README)."""

    model: str = "qwen3.5-4b"  # geometry preset (or YAML) sizing the objects
    compute: Literal["modeled", "real"] = "modeled"
    byte_scale: int = Field(256, ge=1)  # object and budget bytes divided by this (ratios kept)
    ratios: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0)  # working set / device budget
    host_per_device: float = Field(2.0, ge=0.0)  # host budget = this x device budget
    disk_per_stored: float = Field(1.5, gt=0.0)  # NVMe budget = this x bytes stored with unlimited room
    configurations: tuple[Configuration, ...] = tuple(c for c in CONFIGURATIONS if c != "device-ours")
    workloads: tuple[WorkloadSpec, ...] = (
        WorkloadSpec(name="agentic", kind="agentic", sessions=10, turns=10, seed=0,
                     tokens_scale=1.0, side_calls=0.5, sessions_per_second=2.0),
        WorkloadSpec(name="chat", kind="chat", sessions=10, turns=6, seed=1, tokens_scale=0.5),
    )
    headline: str = "agentic"  # the workload the targets are checked on
    headline_ratio: float = 4.0
    chunk_size: int = Field(256, gt=0)
    hash_block_size: int = Field(16, gt=0)
    alignment: int = Field(16, gt=0)
    alpha_grid: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0)
    # modeled compute: FLOPs of the geometry at this device throughput
    device_tflops: float = Field(989.0, gt=0.0)  # H100/H200-class bf16 dense peak
    mfu: float = Field(0.45, gt=0.0, le=1.0)
    overhead_ms: float = Field(10.0, ge=0.0)  # fixed scheduling + launch cost per request
    # full-size bytes per second of a load into the engine from each tier
    load_gbps: dict[str, float] = Field(
        default_factory=lambda: {"device": 1500.0, "host": 25.0, "nvme": 6.0})
    disk_fsync: bool = False  # NVMe without fsync (LMCache's durability): fsync time is not what is modeled
    peers: bool = True  # host/NVMe tiers vs LMCache's LocalCPU/LocalDisk backends
    peer_reps: int = Field(3, ge=1)
    real: RealSpec = RealSpec()

    @field_validator("ratios")
    @classmethod
    def _ratios(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v or any(r <= 0 for r in v):
            raise ValueError("ratios must be a non-empty list of positive numbers")
        return tuple(sorted(set(v)))

    @field_validator("load_gbps")
    @classmethod
    def _bw(cls, v: dict[str, float]) -> dict[str, float]:
        if set(v) != set(LOAD_TIERS) or any(not x > 0 for x in v.values()):
            raise ValueError(f"load_gbps needs a positive figure for each of {LOAD_TIERS}, got {v}")
        return v

    @field_validator("workloads")
    @classmethod
    def _names(cls, v: tuple[WorkloadSpec, ...]) -> tuple[WorkloadSpec, ...]:
        names = [w.name for w in v]
        if not v or len(set(names)) != len(names):
            raise ValueError(f"workloads need unique names, got {names}")
        return v

    @field_validator("byte_scale")
    @classmethod
    def _pow2(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"byte_scale must be a power of two, got {v}")
        return v


DEFAULT_CONFIG_NAME = "configs/capacity-cpu.yaml"


def load_capacity_config(path: str | os.PathLike[str] | None = None,
                         overrides: dict[str, Any] | None = None) -> CapacityConfig:
    """The ``capacity:`` section of ``path`` (the embedded default when None), with
    ``overrides`` on top. Raises ``ConfigError`` naming the key and the file."""
    where = str(path) if path is not None else "<embedded default>"
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{where}: cannot read config: {exc}") from exc
        if not isinstance(loaded, dict) or not isinstance(loaded.get("capacity"), dict):
            raise ConfigError(f"{where}: expected a mapping with a 'capacity:' section")
        extra = sorted(set(loaded) - {"capacity"})
        if extra:
            raise ConfigError(f"{where}: unknown top-level key(s) {extra}; only 'capacity'")
        data = dict(loaded["capacity"])
    data.update(overrides or {})
    try:
        return CapacityConfig.model_validate(data)
    except ValidationError as exc:
        problems = [f"{where}: key 'capacity.{'.'.join(str(p) for p in e['loc'])}': "
                    f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors()]
        raise ConfigError("invalid capacity config:\n  " + "\n  ".join(problems)) from None
