"""One validated configuration schema: LMCache-style keys plus the hybrid keys.

Sources, later ones win: defaults, the YAML file (``path`` argument or the
``HYBRID_CONNECTOR_CONFIG`` env var), then ``HYBRID_CONNECTOR_<KEY>`` env vars (nested keys
joined by ``__``, e.g. ``HYBRID_CONNECTOR_POOLS__HOST__STATE=2GiB``; values are parsed as
YAML scalars). Unknown keys, wrong types and impossible combinations raise ``ConfigError``
naming the key and the file. Sizes accept ``5GB`` (10^9), ``512MiB`` (2^20), ``1.5 GiB`` or
a bare number: GB for the LMCache keys ``max_local_cpu_size``/``max_local_disk_size`` (their
LMCache meaning), bytes everywhere else; a size must be finite, >= 0 and at most 1 PiB
(anything larger is a unit mistake).

Every accepted key is honoured or rejected: keys of a tier that is not configured, the
LMCache keys this version does not implement yet (``use_layerwise``: only its default
loads) and contradictions
(``local_cpu: false`` with ``pools.host``) are errors. ``extra_config`` is a free mapping
for integrations; nothing in the core or the tiers reads it.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hybrid_connector.core.config_server import ClientSettings, ServerSettings
from hybrid_connector.core.config_types import PoolBudget, Pools, Strict, TierReadRates
from hybrid_connector.core.load_gate_config import LoadGate
from hybrid_connector.core.remote_url import CLUSTER, check_remote_url, scheme_of
from hybrid_connector.core.sizes import Bytes, parse_size

log = logging.getLogger(__name__)

ENV_PATH = "HYBRID_CONNECTOR_CONFIG"
ENV_PREFIX = "HYBRID_CONNECTOR_"

class ConfigError(ValueError):
    """A configuration problem; the message names the key and the source file."""


GB_KEYS = ("max_local_cpu_size", "max_local_disk_size")  # a bare number is GB (LMCache)
GBytes = Annotated[int, BeforeValidator(lambda v: parse_size(v, 10**9))]
NonNegFinite = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
KindName = Literal["kv", "state", "anchor"]  # ObjectKind values (keys.py)
ZSTD_DEFAULT_LEVEL = 3


def _zstd_spec(value: object) -> object:
    """``disk_zstd`` shorthand: a list of kinds means each at ``ZSTD_DEFAULT_LEVEL``."""
    if value is None:
        return {}
    if isinstance(value, list | tuple):
        return {k: ZSTD_DEFAULT_LEVEL for k in value}
    return value


# LMCache keys nothing honours yet (the vLLM connector will): only their defaults load.
NOT_HONOURED = ("use_layerwise",)
# Tier keys that used to be read from ``extra_config``; moved to typed top-level keys.
LEGACY_EXTRA = ("disk_zstd", "disk_fsync", "disk_verify_reads", "remote_timeout_s")

TIERS = ("device", "host", "disk", "remote")

class HybridConfig(Strict):
    """The whole configuration. Immutable; build with ``load_config``."""

    # --- LMCache-compatible keys ---
    chunk_size: int = Field(256, gt=0)
    local_cpu: bool = True
    max_local_cpu_size: GBytes = 5 * 10**9
    local_disk: str | None = None
    max_local_disk_size: GBytes = 0
    remote_url: str | None = None
    remote_serde: Literal["naive", "zstd"] = "naive"
    save_decode_cache: bool = False  # vLLM connector: also save KV and states of generated tokens
    use_layerwise: bool = False
    # --- hybrid keys ---
    model: str | None = None  # preset name or path to a model geometry YAML
    hash_block_size: int = Field(16, gt=0)
    alignment: int = Field(16, gt=0)  # engine alignment of usable hit lengths (tokens)
    device_size: Bytes = 0
    pools: Pools = Pools()
    admission: Literal["marconi", "every_block", "last_token"] = "marconi"
    eviction: Literal["lru", "marconi", "marconi_reference"] = "marconi"
    alpha: float | Literal["auto"] = "auto"  # finite >= 0 (see _alpha)
    alpha_objective: Literal["flops", "token_hits"] = "flops"
    # a fixed alpha's score: recency + alpha * efficiency ("sum") or recency * (1 + alpha * eff.)
    marconi_score: Literal["sum", "product"] = "sum"
    # scan-resistant Marconi eviction (policies/eviction/marconi_victims.py: stranded KV first,
    # whole leaves, a LIRS/ARC guard; fallback_states: with it, a state with a deeper state on
    # its chain goes before KV in a shared budget); configs/vllm*.yaml turn both on
    scan_resistant: bool = False
    fallback_states: bool = False
    # auto alpha's candidates; unset: each tuner's own grid (window: 0-2 step 0.1; shadow:
    # shadow_alphas, extended while its top leads); set: these alphas and no other
    alpha_grid: tuple[NonNegFinite, ...] | None = Field(None, strict=False)
    bootstrap_multiplier: int = Field(5, gt=0)
    retune_interval: int = Field(500, ge=0)
    # alpha: auto: twin caches per candidate (tuning/shadow.py) or replayed windows (grid.py)
    alpha_tuner: Literal["shadow", "window"] = "shadow"
    # the shadow tuner's starting grid when alpha_grid is unset (it may extend it)
    shadow_alphas: tuple[NonNegFinite, ...] = Field((0.0, 0.5, 2.0, 8.0, 32.0), min_length=1, strict=False)  # noqa: E501
    shadow_lru: bool = True  # offer LRU with whole-path refresh (SGLang-style) as a candidate
    shadow_z: float = Field(3.0, ge=0.0, allow_inf_nan=False)  # standard errors a switch needs
    # ... in the first shadow_early_requests after the first eviction (lateness costs hits)
    shadow_z_early: float = Field(1.5, ge=0.0, allow_inf_nan=False)
    shadow_early_requests: int = Field(200, ge=0)
    shadow_start: NonNegFinite | Literal["lru"] = "lru"  # the candidate before any evidence
    # how candidates combine recency and FLOPs/byte: Marconi's sum, the aging product, or both
    shadow_score: Literal["sum", "product", "both"] = "both"
    shadow_deterministic: bool = False  # True: never skip, decide at fixed counts (benchmarks)
    shadow_cpu_share: float = Field(0.2, gt=0.0, le=1.0)  # worker CPU / wall, when not deterministic
    # KV and states in one budget: which kind gives up bytes. "kind_order": the kind being
    # saved first; "utility": whichever best victim has the lower Marconi utility.
    pooled_eviction: Literal["kind_order", "utility"] = "kind_order"
    placement_slots: int = Field(0, ge=0)  # checkpoint slots per long shared prefix
    placement_bin: int = Field(64, gt=0)
    placement_decay: float = Field(0.99, gt=0.0, le=1.0)
    placement_tree: bool = False  # project observed depths onto each prompt's own path
    anchor_page_size: int = Field(64, gt=0)
    anchor_density: float = Field(0.25, ge=0.0, le=1.0)
    # "shared": anchor pages only inside tokens another request already brought (Marconi's
    # admission applied to anchors); "all": every page the request computed.
    anchor_admission: Literal["all", "shared"] = "all"
    replay: bool = False
    replay_budget_frac: float = Field(0.05, gt=0.0, le=1.0)
    replay_max_tokens: int = Field(2048, gt=0)
    replay_max_kl: float = Field(0.05, ge=0.0)
    replay_min_top1: float = Field(0.9, ge=0.0, le=1.0)
    # --- eviction across tiers (``hybrid_connector.policies.eviction.tier_value``) ---
    # lru: a full tier pool demotes its least recently used object one tier down (when the
    # eviction policy's merits_demotion agrees); value: it gives up the object losing the
    # least value per byte among its ``tier_value_window`` least recently used candidates
    # and demotes it only to a tier it loads from faster than it is recomputed (else drops
    # it, or keeps only the shared copy). Default lru: see docs/policies.md, "Eviction across tiers"
    tier_eviction: Literal["lru", "value"] = "lru"
    tier_read_gbps: TierReadRates = TierReadRates()
    recompute_tflops: float = Field(445.0, gt=0.0, allow_inf_nan=False)  # effective prefill rate (989 TFLOP/s x MFU 0.45)
    tier_value_window: int = Field(16, ge=1, le=4096)  # candidates scored per eviction
    load_gate: LoadGate = LoadGate()  # refuse slow loads recomputing beats (load_gate_config.py)
    # LMCache key: the deadline of a lookup's remote part (discovering what other
    # instances stored on the shared tier)
    lookup_timeout_ms: int = Field(3000, gt=0, le=600_000)
    # --- tier options (only with that tier configured) ---
    # NVMe: kinds to compress, a list (level 3) or {kind: level 1-22}.
    disk_zstd: Annotated[
        dict[KindName, Annotated[int, Field(ge=1, le=22)]], BeforeValidator(_zstd_spec)
    ] = Field(default_factory=dict)
    disk_fsync: bool = True  # fsync each object file and its directory before indexing it
    disk_verify_reads: bool = True  # check every read's payload checksum
    remote_timeout_s: float = Field(1.0, gt=0.0, allow_inf_nan=False)  # one deadline per call
    remote_chunk_size: Bytes = Field(4 << 20, ge=64 << 10)  # cluster URLs: value chunks
    extra_config: dict[str, Any] = Field(default_factory=dict)  # free: integrations only
    # --- the cache server (hybrid_connector.core.config_server) ---
    server: ServerSettings = Field(default_factory=lambda: ServerSettings.model_validate({}))  # what `hybrid-connector server` listens on
    cache_server: ClientSettings | None = None  # server mode: index and tiers live there

    @model_validator(mode="before")
    @classmethod
    def _legacy_extra(cls, data: Any, info: ValidationInfo) -> Any:
        """Move the tier keys older configs put under ``extra_config`` to their typed keys
        (validated like them); both spellings at once is an error naming both."""
        extra = data.get("extra_config") if isinstance(data, dict) else None
        if not isinstance(extra, dict) or not any(k in extra for k in LEGACY_EXTRA):
            return data
        data, extra = dict(data), dict(extra)
        source = (info.context or {}).get("source", "<config>")
        for key in LEGACY_EXTRA:
            if key not in extra:
                continue
            if key in data:
                raise ValueError(f"extra_config.{key} and {key} are both set; keep only {key}")
            log.warning("%s: extra_config.%s is deprecated, use the top-level key %s",
                        source, key, key)
            data[key] = extra.pop(key)
        data["extra_config"] = extra
        return data

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, v: float | str) -> float | str:
        if isinstance(v, float) and not (math.isfinite(v) and v >= 0):
            raise ValueError(f"alpha must be a finite number >= 0 or 'auto', got {v}")
        return v

    @field_validator("remote_url")
    @classmethod
    def _remote_url(cls, v: str | None) -> str | None:
        if v is not None:
            check_remote_url(v)
        return v

    @field_validator("alpha_grid")
    @classmethod
    def _grid(cls, v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if v is not None and not v:
            raise ValueError("alpha_grid must list at least one alpha")
        return v

    @field_validator(*NOT_HONOURED)
    @classmethod
    def _not_honoured(cls, v: object, info: ValidationInfo) -> object:
        assert info.field_name is not None
        default = cls.model_fields[info.field_name].default
        if v != default:
            raise ValueError(
                f"{info.field_name}: {v!r} is not honoured by this version (only the default "
                f"{default!r} is accepted; the vLLM connector that will honour it is a later issue)"
            )
        return v

    @model_validator(mode="after")
    def _combinations(self) -> HybridConfig:
        if self.chunk_size % self.hash_block_size:
            raise ValueError(
                f"chunk_size ({self.chunk_size}) must be a multiple of hash_block_size "
                f"({self.hash_block_size})"
            )
        if self.replay and self.anchor_density == 0.0:
            raise ValueError("replay is on but anchor_density is 0: no anchors to replay from")
        if self.eviction == "lru" and self.alpha != "auto" and self.alpha != 0.0:
            raise ValueError("alpha is only meaningful with eviction 'marconi'")
        self._check_tuner_grid()
        self._check_tiers()
        if self.cache_server is not None:
            local: list[str] = [k for k in ("local_disk", "remote_url", "device_size", "pools")
                     if k in self.model_fields_set]
            if local:
                raise ValueError(f"cache_server is set but {_are(local)} too: in server mode "
                                 "the tiers live in the server (configure them there)")
        return self

    def _check_tuner_grid(self) -> None:
        """A user-given ``alpha_grid`` is one the shadow tuner can keep to: it replaces
        ``shadow_alphas`` (not both) and holds the tuner's start (LRU is alpha 0)."""
        grid = self.alpha_grid
        if grid is None or self.eviction == "lru" or self.alpha != "auto" or self.alpha_tuner != "shadow":
            return
        if "shadow_alphas" in self.model_fields_set:
            raise ValueError("alpha_grid and shadow_alphas are both set: with alpha_tuner "
                             "'shadow' the tuner's alphas are alpha_grid (set one of them)")
        start = 0.0 if self.shadow_start == "lru" else float(self.shadow_start)
        if start not in grid:
            raise ValueError(f"alpha_grid {list(grid)} does not hold the shadow tuner's start "
                             f"(shadow_start {self.shadow_start!r}: alpha {start:g}); add it "
                             "to the grid or set shadow_start to one of its alphas")

    def _check_tiers(self) -> None:
        """Every tier key is honoured by a configured tier or rejected here."""
        p = self.pools
        if p.host is not None and not self.local_cpu:
            raise ValueError("local_cpu is false but pools.host is set: contradictory "
                             "(drop pools.host or set local_cpu: true)")
        for name, pool, bound, bound_key in (
            ("host", p.host, self.max_local_cpu_size, "max_local_cpu_size"),
            ("device", p.device, self.device_size, "device_size"),
            ("disk", p.disk, self.max_local_disk_size, "max_local_disk_size"),
        ):
            # The host bound always applies (LMCache's size key has a default); the
            # others only when the size key is set at all.
            if pool is not None and (bound or name == "host") and pool.total > bound:
                raise ValueError(f"pools.{name} ({pool.total} B) exceeds {bound_key} ({bound} B)")
        if self.local_disk:
            if p.disk is None and self.max_local_disk_size == 0:
                raise ValueError("local_disk is set but max_local_disk_size is 0")
            if p.disk is not None and p.disk.total == 0:
                raise ValueError("local_disk is set but pools.disk is all 0")
        else:
            unused = [k for k, on in (
                ("max_local_disk_size", self.max_local_disk_size != 0),
                ("pools.disk", p.disk is not None), ("disk_zstd", bool(self.disk_zstd)),
                ("disk_fsync", not self.disk_fsync),
                ("disk_verify_reads", not self.disk_verify_reads)) if on]
            if unused:
                raise ValueError(f"{_are(unused)} set but local_disk is not")
        if self.remote_url:
            if self.budget("remote").total == 0:
                raise ValueError("remote_url is set but pools.remote is empty: give the "
                                 "remote tier per-kind budgets")
            if self.remote_chunk_size != 4 << 20 and scheme_of(self.remote_url) not in CLUSTER:
                raise ValueError("remote_chunk_size is set but remote_url is not a cluster URL")
        else:
            unused = [k for k, on in (
                ("pools.remote", p.remote is not None),
                ("remote_serde", self.remote_serde != "naive"),
                ("remote_timeout_s", self.remote_timeout_s != 1.0),
                ("remote_chunk_size", self.remote_chunk_size != 4 << 20)) if on]
            if unused:
                raise ValueError(f"{_are(unused)} set but remote_url is not")

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
        return PoolBudget.split(tier, total)

    def explicit(self) -> dict[str, Any]:
        """The keys set explicitly (file, env, overrides) as ``load_config`` overrides that
        validate back to the same values (the GB-when-bare size keys as byte strings)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in self.model_fields_set}
        for k in GB_KEYS:
            if k in out:
                out[k] = f"{out[k]}B"
        return out

    @property
    def disk_path(self) -> str | None:
        """``local_disk`` without a ``file://`` prefix."""
        if self.local_disk is None:
            return None
        return self.local_disk.removeprefix("file://")


def _are(keys: list[str]) -> str:
    return f"{', '.join(keys)} {'is' if len(keys) == 1 else 'are'}"


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
        return HybridConfig.model_validate(data, context={"source": where})
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            msg = err["msg"].removeprefix("Value error, ")
            if err["loc"]:
                key = ".".join(str(p) for p in err["loc"])
                problems.append(f"{where}: key '{key}': {msg}")
            else:  # a combination: the message names its keys
                problems.append(f"{where}: {msg}")
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems)) from None
