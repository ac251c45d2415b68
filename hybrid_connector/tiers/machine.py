"""Configured tier sizes against this machine, checked where the tiers are built.

A host tier larger than the machine's memory cannot be allocated (its slab is one eager
allocation), and an NVMe budget larger than the room its directory's filesystem has would
fill the disk in service; both are ``ConfigError``s naming the key and the machine's figure
(``check_sizes``) instead of a raw allocation traceback or a full disk later. Memory is the
machine's total (``MemTotal``: what the kernel's overcommit check measures a single
allocation against); disk room is the filesystem's free space plus what the directory's
own files already take (a warm restart reuses them). A cgroup memory limit is not looked at.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from hybrid_connector.core.config import ConfigError, HybridConfig


def memory_bytes() -> int:
    """The machine's physical memory (``/proc/meminfo`` MemTotal), in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def disk_room(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(free, held)``: free bytes of the filesystem ``path`` is (or will be) on, and the
    bytes of the regular files directly in ``path`` (0 if it does not exist yet)."""
    p = Path(path).absolute()
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the directory is created later: ask its nearest ancestor
    held = 0
    if p.is_dir():
        with os.scandir(p) as it:
            held = sum(e.stat(follow_symlinks=False).st_size for e in it
                       if e.is_file(follow_symlinks=False))
    return shutil.disk_usage(probe).free, held


def _gb(n: int) -> str:
    return f"{n} B = {n / 1e9:.1f} GB"


def check_sizes(config: HybridConfig, disk_path: str | os.PathLike[str] | None = None) -> None:
    """``ConfigError`` if the host pools exceed the machine's memory or the disk pools the
    room at ``disk_path`` (default ``config.disk_path``); see the module docstring."""
    host = config.budget("host").total
    if host > (mem := memory_bytes()):
        key = "pools.host" if config.pools.host is not None else "max_local_cpu_size"
        raise ConfigError(f"{key} ({_gb(host)}) exceeds this machine's memory ({_gb(mem)}); "
                          f"lower it (`hybrid-connector server --host-size` scales the pools)")
    path = disk_path if disk_path is not None else config.disk_path
    disk = config.budget("disk").total if path else 0
    if disk:
        assert path is not None
        free, held = disk_room(path)
        if disk > free + held:
            key = "pools.disk" if config.pools.disk is not None else "max_local_disk_size"
            raise ConfigError(
                f"{key} ({_gb(disk)}) exceeds the room for local_disk {path}: its "
                f"filesystem has {_gb(free)} free (plus {_gb(held)} the directory holds); "
                "lower it (`hybrid-connector server --disk-size` scales the pools)")
