"""The documentation: ``docs/`` builds with ``mkdocs build --strict`` (a broken link, a page
missing from the nav or a missing figure fails it), every config key is in the reference
with its default, the README stays a short front page whose links resolve inside the
repository, and ``hybrid-connector --help`` is written for users."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel

from hybrid_connector.cli import COMMANDS, build_parser
from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.config_server import ClientSettings, ServerSettings
from hybrid_connector.core.config_types import PoolBudget, TierReadRates

ROOT = Path(__file__).resolve().parent.parent
HAVE_MKDOCS = importlib.util.find_spec("mkdocs") is not None and \
    importlib.util.find_spec("material") is not None
needs_mkdocs = pytest.mark.skipif(not HAVE_MKDOCS, reason="mkdocs-material not installed")


def mkdocs_build(cwd: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=env)


@needs_mkdocs
def test_mkdocs_build_strict_passes(tmp_path: Path) -> None:
    run = mkdocs_build(ROOT, tmp_path / "site")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (tmp_path / "site" / "results" / "capacity.png").is_file()  # the hook's figures
    assert "GPU proof" in (tmp_path / "site" / "gpu" / "index.html").read_text()


@needs_mkdocs
def test_mkdocs_strict_fails_on_a_broken_link(tmp_path: Path) -> None:
    """The check above has teeth: the same site with one dead link does not build."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", repo / "docs")
    shutil.copy(ROOT / "mkdocs.yml", repo / "mkdocs.yml")
    (repo / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "mkdocs_hooks.py", repo / "scripts" / "mkdocs_hooks.py")
    (repo / "benchmarks").mkdir()
    (repo / "benchmarks" / "results").symlink_to(ROOT / "benchmarks" / "results")
    shutil.copytree(ROOT / "benchmarks" / "gpu", repo / "benchmarks" / "gpu",
                    ignore=shutil.ignore_patterns("*.py", "*.sh", "*.txt"))
    assert mkdocs_build(repo, tmp_path / "ok").returncode == 0  # the copy builds as is
    page = repo / "docs" / "vllm.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    run = mkdocs_build(repo, tmp_path / "broken")
    assert run.returncode != 0
    assert "no-such-page.md" in run.stdout + run.stderr


def contract_layers() -> list[list[str]]:
    """The package layers of pyproject's import-linter ``layers`` contract, top first."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c["layers"] for c in contracts["contracts"] if c["id"] == "layers"]
    return [sorted(p.strip().removeprefix("hybrid_connector.") for p in row.split("|"))
            for row in layers]


def test_the_architecture_pages_layer_table_is_the_contract() -> None:
    """docs/architecture.md's layer table lists the packages in the contract's order."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page[page.index("## Layers"):].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", section, re.M)
    assert [int(n) for n, _ in rows] == list(range(1, len(rows) + 1))
    assert [sorted(re.findall(r"`(\w+)`", cell)) for _, cell in rows] == contract_layers()
    packages = {p.name for p in (ROOT / "hybrid_connector").iterdir()
                if (p / "__init__.py").is_file()}
    components = (ROOT / "docs" / "components.md").read_text()
    for package in packages:  # every package has its section
        assert re.search(rf"^## .*`{package}/`", components, re.M), package


PACKAGES = {"core", "geometry", "tree", "payload", "index", "policies", "runtime", "remote", "sim",
            "bench", "cli", "server", "integrations", "tiers", "kernels", "presets"}
CODE = re.compile(r"`([^`\s]+)`")
DOTTED = re.compile(r"^(hybrid_connector(?:\.\w+)+)(?:\(\))?$")
PKG = ROOT / "hybrid_connector"
# Pages that list modules by their bare file name, inside a package's section
LISTS_MODULES = ("docs/architecture.md", "docs/components.md")


def module_exists(dotted: str) -> bool:
    """``hybrid_connector.a.b[.attr]`` names a module or package file (an attribute of one
    may close it)."""
    parts = dotted.split(".")
    for n in (len(parts), len(parts) - 1):
        base = ROOT.joinpath(*parts[:n])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return True
    return False


def stale_names(page: str, text: str) -> list[str]:
    """The module paths and dotted names ``text`` mentions that do not exist."""
    stale = []
    for code in CODE.findall(text):
        if (m := DOTTED.match(code)) is not None:
            if not module_exists(m.group(1)):
                stale.append(code)
            continue
        path = code.removeprefix("hybrid_connector/")
        if any(c in path for c in "*{},()") or not (path.endswith(".py") or "/" in path):
            continue
        if path.split("/")[0] in PACKAGES or path == "assemble.py":
            if not (PKG / path.rstrip("/")).exists():
                stale.append(code)
        elif "/" not in path and page in LISTS_MODULES and not any(PKG.rglob(path)):
            stale.append(code)
    return stale


@pytest.mark.parametrize("page", ["README.md", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))])
def test_module_paths_in_the_docs_exist(page: str) -> None:
    """Every package path (``hybrid_connector/x/y.py``, or ``x/y.py`` relative to it) and
    dotted module a page names exists: no name from before the package moved."""
    stale = stale_names(page, (ROOT / page).read_text())
    assert not stale, f"{page} names modules that do not exist: {stale}"


def fields(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def test_every_config_key_is_in_the_reference() -> None:
    ref = (ROOT / "docs" / "configuration.md").read_text()
    keys = [*fields(HybridConfig), *fields(ServerSettings), *fields(ClientSettings),
            *fields(PoolBudget), *fields(TierReadRates)]
    missing = [k for k in keys if f"`{k}`" not in ref and f"`{k}:`" not in ref
               and f".{k}`" not in ref and f"<{k}>" not in ref]
    # pools.<tier>.<kind> names the Pools fields as tiers; TierReadRates' as its default
    missing = [k for k in missing if k not in ("pools", "device", "host", "disk", "remote")
               or k not in ref]
    assert not missing, f"config keys not in docs/configuration.md: {missing}"


def test_the_readme_is_short_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) < 12_000
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert targets
    for target in targets:
        assert "://" not in target, target
        path, _, anchor = target.partition("#")
        file = (ROOT / path).resolve()
        assert file.is_relative_to(ROOT) and file.exists(), target
        if anchor:
            heads = re.findall(r"^#+ (.*)$", file.read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-") for h in heads}
            assert anchor in slugs, (target, sorted(slugs))


def test_no_reference_leaves_the_repository() -> None:
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                 ROOT / "hybrid_connector" / "payload" / "layout.py"]:
        text = page.read_text()
        assert "../shared" not in text and "DESIGN.md" not in text, page


# What a user's help must not show: how commands register, issue numbers, code paths,
# reST markup, issue targets.
INTERNAL = re.compile(r"parser hook|\bCOMMANDS\b|func=|(?i:\bissue\b|\btargets?\b)|"
                      r"hybrid_connector\.|``|\bMET\b|MISSED|DESIGN")


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every (nested) subcommand's parser by its program name, e.g. 'hybrid-connector bench
    capacity'."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found[child.prog] = child
                found.update(subcommands(child))
    return found


def test_cli_help_is_for_users(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert not INTERNAL.search(out), INTERNAL.search(out)
    assert "examples:" in out and "hybrid-connector bench capacity" in out
    names = re.findall(r"^    (\S+) +\S", out, re.M)
    assert len(names) == len(COMMANDS), out  # one line, with its help, per subcommand


def test_every_subcommands_help_says_what_it_does_with_an_example() -> None:
    """Each subcommand's ``--help`` (nested ones included) has a description, an examples
    section whose lines run that very command, and no internal notes."""
    commands = subcommands(build_parser())
    assert len(commands) >= len(COMMANDS) + 1  # bench capacity below bench
    for prog, parser in commands.items():
        text = parser.format_help()
        assert parser.description, prog
        assert not INTERNAL.search(text), (prog, INTERNAL.search(text))
        _, sep, examples = text.partition("\nexamples:\n")
        assert sep, f"{prog} --help has no examples section"
        runs = [line.split("#")[0].split() for line in examples.splitlines()
                if line.startswith("  hybrid-connector ")]
        assert runs, f"{prog} --help shows no example command"
        assert any(" ".join(run).startswith(prog) for run in runs), (prog, runs)
        for run in runs:  # each example parses (nothing is run)
            with contextlib.redirect_stderr(io.StringIO()):
                build_parser().parse_args(run[1:])
