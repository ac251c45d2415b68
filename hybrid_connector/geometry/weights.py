"""Which weights stored bytes belong to: the ``model_id`` an engine integration puts into the
key fingerprint (``index.state``) beside the geometry.

The geometry (architecture, dims, dtypes, TP layout) is what a fine-tune shares with its
base model, and an engine's block hashes cover tokens and request inputs, not weights. So
without the weights in the fingerprint, an engine restarted on other weights of the same
architecture adopts what its NVMe tier kept for the old ones, and engines serving
different weights over one remote tier load each other's KV and states: wrong outputs,
silently.

``weights_id(model, revision)``: ``model`` as the engine names it (a local
directory or a hub id) and its revision, plus a digest of the weight files' names, sizes
and modification times, read from the directory, or for a hub id from the local hub
cache's snapshot of that revision when there is one (the snapshot's path holds its
commit). An in-place upgrade of the files changes it; reading the weights themselves would
take minutes at start-up. A hub id with no local snapshot gives ``id@revision`` alone.
``config_digest`` adds the model's configuration as the engine runs it (after overrides:
a RoPE scaling, a norm epsilon change the KV of the same weights). Engines that share a
remote tier across hosts, where the copies differ in path or file times, state that they
serve the same weights by setting the integration's explicit ``model_id``, to which the
configuration's digest is still added. ``model_identity`` puts the two together, as every
integration fingerprints its keys.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import blake3

#: files that hold weights (what an upgrade in place rewrites)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _files_digest(directory: Path) -> str:
    """Digest of the weight files' names, sizes and modification times (ns) in
    ``directory`` (top level; "none" when it holds none)."""
    rows = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.name.endswith(WEIGHT_SUFFIXES) and entry.is_file():
            st = entry.stat()  # follows links: a hub snapshot links into its blobs
            rows.append(f"{entry.name}:{st.st_size}:{st.st_mtime_ns}")
    return blake3.blake3("\n".join(rows).encode()).hexdigest(length=8) if rows else "none"


def _hub_snapshot(repo: str, revision: str | None, cache_dir: str | None) -> Path | None:
    """The local hub cache's snapshot of ``repo`` at ``revision`` (None: not there)."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo, revision=revision, cache_dir=cache_dir,
                                      local_files_only=True))
    except Exception:  # no hub library, not a repo id, not downloaded: nothing to read
        return None


def weights_id(model: str, revision: str | None = None, cache_dir: str | None = None) -> str:
    """The identity of the weights ``model`` names (see the module docstring);
    ``cache_dir``: the hub cache the engine downloads into (None: the default one)."""
    if not model:
        return ""
    path = Path(model)
    if path.is_dir():
        return f"{path.resolve()}@{revision or ''}#{_files_digest(path)}"
    snap = _hub_snapshot(model, revision, cache_dir)
    if snap is not None:
        return f"{model}@{snap.name}#{_files_digest(snap)}"
    return f"{model}@{revision or ''}"


def config_digest(config: Any) -> str:
    """Digest of a model configuration (a transformers ``PretrainedConfig`` or a mapping)
    as the engine runs it: every field but private ones (``_name_or_path``, ``_commit_hash``)
    and ``transformers_version``; "" for None."""
    if config is None:
        return ""
    raw = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    kept = {k: v for k, v in raw.items() if not k.startswith("_") and k != "transformers_version"}
    blob = json.dumps(kept, sort_keys=True, default=str).encode()
    return "cfg:" + blake3.blake3(blob).hexdigest(length=8)


def model_identity(model: str, revision: str | None, config: Any, cache_dir: str | None = None,
                   stated: str | None = None) -> str:
    """The ``model_id`` an integration fingerprints keys with: ``stated`` (the operator's
    own name for the weights) or ``weights_id(model, revision, cache_dir)``, then
    ``config_digest(config)``."""
    weights = str(stated) if stated else weights_id(model, revision, cache_dir)
    return f"{weights}|{config_digest(config)}"
