"""The index's state table (``hybrid_connector.index.state.StateTable``) is the only writer of
its fields: the placement of objects, pending puts, doomed objects, leases, the ops left for
the workers and other models' drops.

The check parses every module of ``hybrid_connector.index`` with ``ast`` and reports, outside
the ``StateTable`` class, any assignment, augmented or annotated assignment, ``del``, or
mutating method call (``add``, ``append``, ``pop``, ``discard``, ``update``, ...) whose
target is one of the table's fields, and any use of its private fields at all (an alias
would escape the first rule). The fields are read from ``StateTable.__init__``, so the list
cannot go stale; their public spellings (``where``, ``pending``, ...: the read-only views
``IndexCore`` offers) count too. The negative controls run the same check over a copy of
the package with one write added.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "hybrid_connector" / "index"
OWNER_MODULE, OWNER_CLASS = "state.py", "StateTable"
MUTATORS = {"add", "append", "extend", "insert", "pop", "popitem", "discard", "remove",
            "update", "clear", "setdefault", "subtract", "__setitem__", "__delitem__"}
# Names the state had before it had one owner (IndexCore's fields), still its public views.
LEGACY = {"foreign_drops"}


def table_fields(index_dir: Path) -> tuple[set[str], set[str]]:
    """(private fields, every name that stands for a field) of ``StateTable``."""
    tree = ast.parse((index_dir / OWNER_MODULE).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == OWNER_CLASS)
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    fields = {t.attr for n in ast.walk(init) if isinstance(n, ast.Assign | ast.AnnAssign)
              for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
              if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
              and t.value.id == "self"}
    private = {f for f in fields if f.startswith("_")}
    return private, fields | {f.lstrip("_") for f in fields} | LEGACY


def _field_of(node: ast.expr, names: set[str]) -> str | None:
    """The table field ``node`` writes through (``x.where``, ``x.where[k]``), if any."""
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute) and node.attr in names:
        return node.attr
    return None


def writes_outside_owner(index_dir: Path) -> list[str]:
    """``module:line: what`` for every write of a table field outside ``StateTable``."""
    private, names = table_fields(index_dir)
    found: list[str] = []
    for path in sorted(index_dir.glob("*.py")):
        tree = ast.parse(path.read_text())
        owner_lines: set[int] = set()
        if path.name == OWNER_MODULE:
            for n in tree.body:
                if isinstance(n, ast.ClassDef) and n.name == OWNER_CLASS:
                    owner_lines = set(range(n.lineno, (n.end_lineno or n.lineno) + 1))
        for node in ast.walk(tree):
            line = getattr(node, "lineno", 0)
            if line in owner_lines:
                continue
            what = None
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
                targets = (node.targets if isinstance(node, ast.Assign | ast.Delete)
                           else [node.target])
                hit = [f for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])
                       if (f := _field_of(e, names))]
                if hit:
                    what = f"{type(node).__name__.lower()} of {hit[0]}"
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in MUTATORS):
                field = _field_of(node.func.value, names)
                if field:
                    what = f"{field}.{node.func.attr}()"
            elif isinstance(node, ast.Attribute) and node.attr in private:
                what = f"use of the private {node.attr}"
            if what:
                found.append(f"{path.name}:{line}: {what}")
    return sorted(set(found))


def test_the_state_table_is_the_only_writer() -> None:
    private, names = table_fields(INDEX)
    assert {"_where", "_pending", "_doomed", "_leases", "_leased", "_outbox"} <= private
    assert {"where", "pending", "doomed", "leases", "leased", "outbox"} <= names
    assert writes_outside_owner(INDEX) == []


@pytest.mark.parametrize(("module", "line", "what"), [
    ("saving.py", "ix.where[key] = node.id", "assign of where"),
    ("saving.py", "ix.pending.add(key)", "pending.add()"),
    ("reclaim.py", "ix.doomed.discard(key)", "doomed.discard()"),
    ("reclaim.py", "ix.outbox = []", "assign of outbox"),
    ("discovery.py", "ix.table.max_kv_len += 1", "augassign of max_kv_len"),
    ("rebuild.py", "del ix.leases[lease.id]", "delete of leases"),
    ("cache_index.py", "self.leased.update(keys)", "leased.update()"),
    ("cache_index.py", "w = self.table._where", "use of the private _where"),
    ("state.py", "self.foreign_drops.append(key)", "foreign_drops.append()"),
])  # fmt: skip
def test_a_write_elsewhere_is_caught(tmp_path: Path, module: str, line: str, what: str) -> None:
    copy = tmp_path / "index"
    shutil.copytree(INDEX, copy, ignore=shutil.ignore_patterns("__pycache__"))
    path = copy / module
    source = path.read_text()
    path.write_text(source + f"\n\ndef _broken(ix, self, key, node, keys, lease):\n    {line}\n")
    where = len(source.splitlines()) + 4
    assert writes_outside_owner(copy) == [f"{module}:{where}: {what}"]
