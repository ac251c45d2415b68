"""Architecture: the import-linter contracts in pyproject.toml hold, fail when broken, cover
every module of ``hybrid_connector``, and the import graph has no cycle.

The contracts (``[tool.importlinter]``) express the layering, integrations -> runtime
-> policies, tiers -> kernels; ``lint-imports`` runs in a subprocess with this interpreter
from the directory whose packages it checks (import-linter puts the working directory first
on ``sys.path``, so the checkout's packages win over an installed copy). The negative
controls run the same contracts over a copy of the packages with one forbidden import added.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hybrid_connector",)
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LINT, "--no-cache", "--no-logo"],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def contracts() -> list[dict[str, Any]]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]["contracts"]


def test_contracts_are_kept() -> None:
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout
    kept = re.findall(r"\bKEPT\b", out.stdout)
    assert len(kept) == len(contracts()) >= 3, out.stdout


def _copy_packages(dst: Path) -> None:
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")


@pytest.mark.parametrize(("module", "line", "contract"), [
    # kernels are the bottom layer: they import nothing of the project
    ("hybrid_connector/kernels/_grid.py", "import hybrid_connector.runtime.cache", "Dependencies flow downward"),
    # tiers may use only the core vocabulary
    ("hybrid_connector/tiers/ops.py", "import hybrid_connector.geometry.model", "Dependencies flow downward"),
    # the runtime never imports an integration
    ("hybrid_connector/runtime/suffix_replay.py", "import hybrid_connector.integrations.hf.replay",
     "Dependencies flow downward"),
    # the policies decide what is known; they never reach for bytes
    ("hybrid_connector/policies/eviction/lru.py", "import hybrid_connector.tiers.ops", "never touch the byte tiers"),
    # inside the index, the state table is below the modules that drive it
    ("hybrid_connector/index/state.py", "import hybrid_connector.index.saving", "Inside the index"),
    # a cycle inside one package (no layer covers tiers' own modules)
    ("hybrid_connector/tiers/tier.py", "import hybrid_connector.tiers.manager", "No import cycles"),
])  # fmt: skip
def test_a_forbidden_import_breaks_the_contracts(tmp_path: Path, module: str, line: str,
                                                contract: str) -> None:
    _copy_packages(tmp_path)
    path = tmp_path / module
    path.write_text(path.read_text() + f"\n{line}  # noqa: E402, F401\n")
    out = lint_imports(tmp_path)
    assert out.returncode != 0, out.stdout
    broken = out.stdout.split("Broken contracts", 1)[-1]
    assert re.search(rf"{re.escape(contract)}.* BROKEN", out.stdout.replace("\n", " ")), out.stdout
    importer = module.removesuffix(".py").replace("/", ".")
    # layer reports name modules in full, cycle reports relative to their package
    assert importer in broken or f".{importer.rsplit('.', 1)[1]} -> " in broken, broken


def _layer_modules(layers: Iterable[str]) -> set[str]:
    names: set[str] = set()
    for layer in layers:
        for name in re.split(r"[|:]", layer):
            names.add(name.strip().strip("()"))
    return names


def test_every_module_has_a_layer() -> None:
    """A new module of ``hybrid_connector`` must say where it sits (the layers contract only
    constrains the modules it names)."""
    (layers,) = [c for c in contracts() if c["id"] == "layers"]
    placed = _layer_modules(layers["layers"])
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    children = graph.find_children("hybrid_connector")
    assert children, "grimp found no modules"
    assert sorted(children - placed) == []
    assert {"hybrid_connector.tiers", "hybrid_connector.kernels"} <= placed


def test_the_top_level_holds_packages_and_the_composition_root_only() -> None:
    """The folders are the layers: no module sits directly under ``hybrid_connector/`` but
    ``__init__`` and the composition root (``assemble``); the entry points are ``cli/``."""
    top = ROOT / "hybrid_connector"
    modules = sorted(p.name for p in top.glob("*.py"))
    assert modules == ["__init__.py", "assemble.py"]
    packages = sorted(p.name for p in top.iterdir() if (p / "__init__.py").is_file())
    (layers,) = [c for c in contracts() if c["id"] == "layers"]
    placed = {m.removeprefix("hybrid_connector.") for m in _layer_modules(layers["layers"])}
    assert set(packages) <= placed


def cycles(graph: Mapping[str, Iterable[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[set[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph.get(start, ())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph.get(w, ()))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def _module_graph(exclude_type_checking: bool) -> dict[str, set[str]]:
    g = grimp.build_graph(*PACKAGES, cache_dir=None, exclude_type_checking_imports=exclude_type_checking)
    return {m: g.find_modules_directly_imported_by(m) for m in g.modules}


def test_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    import hybrid_connector

    assert Path(hybrid_connector.__file__).is_relative_to(ROOT)  # the checkout, not a copy
    assert cycles(_module_graph(exclude_type_checking=True)) == []
    # With annotations-only imports counted, the only cycle allowed is the known one (the
    # index's helpers annotating CacheIndex); it may go, no other may come.
    known = {"hybrid_connector.index.cache_index", "hybrid_connector.index.reclaim", "hybrid_connector.index.saving"}
    assert all(c <= known for c in cycles(_module_graph(exclude_type_checking=False)))
