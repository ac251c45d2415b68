"""The tiers a config describes, built in the process that holds the bytes, and the
ledger's view of them (``tier_specs``) for a process that holds none (a vLLM scheduler
whose bytes live in its TP workers).

``tier_specs(config)`` equals ``[spec_of(t) for t in build_tiers(config)]`` without
allocating a slab or opening a directory, so a scheduler's ledger accepts exactly what
every worker's tiers accept (``tests/tiers/test_configured.py`` holds them equal).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.tiers.backend import Backend
from hybrid_connector.tiers.ledger.ledger import TierSpec
from hybrid_connector.tiers.slab import page_bytes
from hybrid_connector.tiers.tier import Tier


def _budgets(config: HybridConfig, tier: str) -> dict[ObjectKind, int]:
    """The most bytes each kind may take in ``tier`` (``PoolBudget.kinds``)."""
    return {ObjectKind(k): v for k, v in config.budget(tier).kinds().items()}


def _joint(config: HybridConfig, tier: str) -> tuple[ObjectKind, ...]:
    """The kinds sharing one budget in ``tier`` (``kv_state``), else none."""
    return (ObjectKind.KV, ObjectKind.STATE) if config.budget(tier).pooled else ()


def _present(config: HybridConfig) -> list[str]:
    """Names of the configured tiers, fastest first (a tier with no budget is left out)."""
    out = [t for t in ("device", "host") if config.budget(t).total]
    if config.disk_path and config.budget("disk").total:
        out.append("disk")
    if config.remote_url and config.budget("remote").total:
        out.append("remote")
    return out


def build_tiers(config: HybridConfig, device: torch.device | str | None = None,
                disk_path: str | Path | None = None) -> list[Tier]:
    """Tiers from the config's typed keys (device, host, disk, remote; see
    ``TieredStore.from_config``). ``disk_path`` replaces ``config.disk_path`` (one directory
    per TP rank: a directory belongs to one tier instance). Raises ValueError/OSError for a
    bad remote URL or an unusable disk path, ``ConfigError`` for a host pool larger than the
    machine's memory or a disk pool larger than its filesystem's room
    (``hybrid_connector.tiers.machine.check_sizes``), ``hybrid_connector.tiers.dirlock.DirectoryLocked`` for a disk path a
    live store holds."""
    from hybrid_connector.tiers.device import DeviceTier
    from hybrid_connector.tiers.host import HostTier
    from hybrid_connector.tiers.machine import check_sizes
    from hybrid_connector.tiers.nvme import NvmeTier
    from hybrid_connector.tiers.remote.tier import RemoteTier

    check_sizes(config, disk_path)
    tiers: list[Tier] = []
    for name in _present(config):
        b = _budgets(config, name)
        if name == "device":
            tiers.append(DeviceTier(b, device=device, joint=_joint(config, name)))
        elif name == "host":
            tiers.append(HostTier(b, joint=_joint(config, name)))
        elif name == "disk":
            tiers.append(NvmeTier(
                disk_path if disk_path is not None else str(config.disk_path), b,
                zstd=zstd_kinds(config), fsync=config.disk_fsync,
                verify_reads=config.disk_verify_reads, joint=_joint(config, name)))
        else:
            tiers.append(RemoteTier(
                str(config.remote_url), b, serde=config.remote_serde,
                timeout=config.remote_timeout_s, limits=manifest_limits(config),
                chunk_size=config.remote_chunk_size))
    return tiers


def shared_view(config: HybridConfig) -> Tier | None:
    """A client of the config's shared (remote) tier for a process that holds no bytes of
    its own (a vLLM scheduler): what ``discover`` reads other instances' manifests through.
    None without a remote tier."""
    if not (config.remote_url and config.budget("remote").total):
        return None
    from hybrid_connector.tiers.remote.tier import RemoteTier

    return RemoteTier(str(config.remote_url), _budgets(config, "remote"), serde=config.remote_serde,
                      timeout=config.remote_timeout_s, limits=manifest_limits(config),
                      chunk_size=config.remote_chunk_size)


def tier_specs(config: HybridConfig) -> list[TierSpec]:
    """The ledger's view of ``build_tiers(config)``: budgets (KV and states in one pool
    where ``kv_state`` gives them one), slow and shared flags, slab page sizes (device and
    host), without building anything."""
    specs = []
    for name in _present(config):
        b = _budgets(config, name)
        slab = name in ("device", "host")
        tier_name = {"disk": "nvme"}.get(name, name)
        specs.append(TierSpec.per_kind(
            tier_name, b, slow=name in ("disk", "remote"), shared=name == "remote",
            grains={k: page_bytes(b[k]) if slab else 1 for k in ObjectKind},
            joint=_joint(config, name)))
    return specs


def ledger_backend(config: HybridConfig) -> Backend:
    """A ``Backend`` over ``tier_specs(config)`` with no bytes here (the vLLM connector's
    scheduler side: the tiers live in the workers). It asks saves for object metadata
    (tokens, chain hashes) only when a tier outlives the workers or is shared (NVMe,
    remote): a warm restart re-links from it, manifests announce it, a demotion carries it
    along; a host or device copy dies with its worker, so building it there is waste."""
    specs = tier_specs(config)
    backend = Backend(specs)
    backend.keeps_meta = any(t.slow or t.shared for t in specs)
    return backend


def zstd_kinds(config: HybridConfig) -> dict[ObjectKind, int]:
    """``config.disk_zstd`` (kind name -> level, validated at load) keyed by ``ObjectKind``."""
    return {ObjectKind(k): v for k, v in (config.disk_zstd).items()}


def manifest_limits(config: HybridConfig) -> Any:
    """Manifest bounds with room for the record announcing the largest KV chunk ``config``
    cuts (``hybrid_connector.index.manifests``: its key, size, tokens and block hashes); a smaller
    bound would leave long chunks unannounced, so other instances could never find them."""
    from hybrid_connector.core.keys import MAX_PREFIX_BYTES
    from hybrid_connector.tiers.manifest import RECORD_BYTES, Limits

    n = config.chunk_size
    meta = ObjectMeta(prev=bytes(MAX_PREFIX_BYTES), tokens=(1 << 40,) * n,  # 8-byte ids
                      block_size=config.hash_block_size,
                      hashes=(bytes(MAX_PREFIX_BYTES),) * (n // config.hash_block_size))
    return Limits(max_record_bytes=max(RECORD_BYTES, len(meta.to_bytes()) + 1024))
