"""Walk one save through the package and count how often it changes module.

Builds a small ``HybridCache`` (a two-layer hybrid model over an in-memory store, whose
ops run inline, so the save and its completion run in this thread), saves one prompt to
warm up, then traces one ``HybridCache.save_async`` of a longer prompt (KV chunks and a
checkpoint) until its future is done. Only frames of ``hybrid_connector.*`` count, and of those not dunder methods (a key's
``__hash__``, a dataclass's ``__init__``) nor the core vocabulary (``hybrid_connector.core``:
keys, hashes, metadata), which every layer uses as values (``--all`` counts them too).

The walk is the sequence of places control is in: each module of the index, and elsewhere
the package of a layer (``tiers``, ``tree``, ``policies``, ``runtime``; ``--modules``: every
module), one entry per call into or return to a counted frame whose place differs from the
previous entry. It prints:

* moves: module changes along the walk;
* climbs: moves to a module in a higher layer, with the layers of pyproject.toml's
  import-linter contracts (``layers`` between packages, ``index-layers`` inside the
  index); returning from a call down is a climb too;
* returns: moves into a module the walk had already left.

Usage: ``python scripts/walk_save.py [--show]`` (``--show`` prints the walk). To measure
another checkout, put it first on ``PYTHONPATH``; the layers are read from the
pyproject.toml beside the imported package.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from types import FrameType

import numpy as np
import torch

import hybrid_connector
from hybrid_connector import assemble
from hybrid_connector.core.config import load_config
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.plan import SaveItem
from hybrid_connector.tiers.memory import MemoryStore

PKG = "hybrid_connector"
# Value types every layer uses (keys, hashes, metadata): not counted unless --all.
VOCAB = PKG + ".core."
GEOMETRY = ModelGeometry.from_dict({
    "name": "walk-hybrid", "architecture": "qwen3_5_text", "hidden_size": 8, "vocab_size": 64,
    "layers": ["gdn+mlp", "attention+mlp"],
    "attention": {"num_heads": 1, "num_kv_heads": 1, "head_dim": 4},
    "gdn": {"num_k_heads": 1, "num_v_heads": 1, "head_k_dim": 2, "head_v_dim": 2,
            "conv_kernel": 2},
    "mlp": {"intermediate_size": 16},
})
CHUNK = 8


def layer_ranks(pyproject: Path) -> tuple[list[list[str]], list[list[str]]]:
    """(package layers, index layers), top first, each layer a list of sibling names."""
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    by_id = {c["id"]: c for c in contracts}
    split = lambda layers: [[s.strip() for s in entry.split("|")] for entry in layers]  # noqa: E731
    return split(by_id["layers"]["layers"]), split(by_id["index-layers"]["layers"])


def rank(module: str, packages: list[list[str]], index: list[list[str]]) -> tuple[int, int]:
    """(package layer, index layer) of ``module``: smaller is higher; -1 when unplaced."""
    pkg = next((i for i, layer in enumerate(packages)
                if any(module == m or module.startswith(m + ".") for m in layer)), -1)
    inner = -1
    if module.startswith(PKG + ".index."):
        name = module.split(".")[2]
        inner = next((i for i, layer in enumerate(index) if name in layer), -1)
    return pkg, inner


def climbs_up(src: str, dst: str, packages: list[list[str]], index: list[list[str]]) -> bool:
    (sp, si), (dp, di) = rank(src, packages, index), rank(dst, packages, index)
    if sp != dp:
        return -1 not in (sp, dp) and dp < sp
    return -1 not in (si, di) and di < si


def items(toks: np.ndarray, upto: int, state_at: int) -> list[SaveItem]:
    kv_b = GEOMETRY.kv_bytes_per_token()
    out = [SaveItem(ObjectKind.KV, s, s + CHUNK, torch.zeros(CHUNK * kv_b, dtype=torch.uint8))
           for s in range(0, upto, CHUNK)]
    out.append(SaveItem(ObjectKind.STATE, state_at, state_at,
                        torch.zeros(GEOMETRY.state_bytes(), dtype=torch.uint8)))
    return out


def place(module: str, layers: list[list[str]]) -> str:
    """Where ``module`` counts: each index module on its own, elsewhere its layer's package
    (``tiers.indexed`` -> ``tiers``), so a package's own helpers are not moves."""
    if module.startswith(PKG + ".index."):
        return ".".join(module.split(".")[:3])
    return next((m for layer in layers for m in layer
                 if module == m or module.startswith(m + ".")), module)


def walk(layers: list[list[str]], everything: bool = False, modules: bool = False) -> list[str]:
    """The places (see ``place``; ``modules``: every module) one traced ``save_async``
    (and its completion) runs through."""
    cfg = load_config(overrides={"chunk_size": CHUNK, "hash_block_size": 4, "alignment": 4,
                                 "anchor_page_size": 4}, environ={})
    store = MemoryStore({k: 10**6 for k in ObjectKind})
    cache = assemble.cache(cfg, GEOMETRY, store)
    rng = np.random.default_rng(0)
    first = rng.integers(0, 64, 16)
    second = np.concatenate([first, rng.integers(0, 64, 16)])
    cache.save(first, items(first, 16, 16))  # warm up: lazy imports, first-use caches
    todo = items(second, 32, 32)[2:]  # the first 16 tokens' KV is there already
    seq: list[str] = []

    def counted(frame: FrameType | None) -> str | None:
        """The module of the innermost counted frame at or above ``frame``."""
        while frame is not None:
            module, name = frame.f_globals.get("__name__"), frame.f_code.co_name
            if (isinstance(module, str) and module.startswith(PKG + ".")
                    and (everything or not (name.startswith("__") or module.startswith(VOCAB)))):
                return module
            frame = frame.f_back
        return None

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event in ("call", "return"):
            module = counted(frame if event == "call" else frame.f_back)
            if module is not None and not modules:
                module = place(module, layers)
            if module is not None and (not seq or seq[-1] != module):
                seq.append(module)

    sys.setprofile(profile)
    try:
        cache.save_async(second, todo).result()
    finally:
        sys.setprofile(None)
    cache.close()
    return seq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--show", action="store_true", help="print the walk, one move a line")
    ap.add_argument("--all", action="store_true",
                    help="count every frame (default: not dunder methods such as __hash__, and "
                         "not the core vocabulary's value types)")
    ap.add_argument("--modules", action="store_true",
                    help="count moves between any two modules (default: between index modules "
                         "and, elsewhere, between the packages of the layers)")
    args = ap.parse_args()
    root = Path(hybrid_connector.__file__).resolve().parents[1]
    packages, index = layer_ranks(root / "pyproject.toml")
    seq = walk(packages, args.all, args.modules)
    moves = list(zip(seq, seq[1:], strict=False))
    climbs = sum(climbs_up(a, b, packages, index) for a, b in moves)
    returns = sum(b in seq[:i + 1] for i, (_, b) in enumerate(moves))
    if args.show:
        for a, b in moves:
            up = " (up)" if climbs_up(a, b, packages, index) else ""
            print(f"  {a.removeprefix(PKG + '.')} -> {b.removeprefix(PKG + '.')}{up}")
    print(f"package: {root}")
    print(f"one save_async, 2 KV chunks + 1 checkpoint: {len(moves)} moves between "
          f"{len(set(seq))} places, {climbs} back up a layer, {returns} back into a "
          "module already left")


if __name__ == "__main__":
    main()
