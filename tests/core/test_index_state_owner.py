"""The index's state table (``hybrid_connector.index.table.StateTable``) is the only writer of
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

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "hybrid_connector" / "index"
OWNER_MODULE, OWNER_CLASS = "table.py", "StateTable"
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


# ---------------------------------------------------------------- the table's contracts
def test_ops_left_undrained_run_first_in_the_next_ticket() -> None:
    """Ops an earlier call left (here ``finish`` releasing dead KV) were decided first, so
    a save that comes before the next ``drain`` carries them ahead of its own, and its
    ``puts`` still point at its own puts."""
    from cache_support import kv_items, make_cache, state_item

    from hybrid_connector.tiers.ops import Put, Remove

    cache = make_cache(admission="last_token")
    ix = cache.index
    dead = np.arange(30)
    cache.save(dead, kv_items(dead, 0, 8))
    ix.finish(dead)  # the index alone: its Remove stays queued, not drained
    toks = np.arange(100, 116)
    items = [*kv_items(toks, 0, 16), state_item(toks, 16)]
    ticket = ix.begin_save(toks, [it.spec for it in items])
    assert [type(op) for op in ticket.ops[:1]] == [Remove] and ix.drain() == []
    assert {key for key, _ in ticket.puts.values()} == {k for k in ticket.keys if k}
    for i, (key, _) in ticket.puts.items():
        assert isinstance(ticket.ops[i], Put) and ticket.ops[i].key == key
    ix.complete_save(ticket, list(range(len(ticket.ops))), [True] * len(ticket.ops))
    assert ix.pending == frozenset()
    cache.check_integrity()


def test_check_names_a_broken_table() -> None:
    from hybrid_connector.core.keys import ObjectKey, ObjectKind
    from hybrid_connector.index.table import StateTable
    from hybrid_connector.tree.radix import IntegrityError

    key = ObjectKey("fp", b"\x00" * 16, ObjectKind.STATE, 4, 4)
    table = StateTable()
    table.index_pending(key, 3)
    lease = table.open_lease((), 3, (), (key,))
    table.check()
    assert not table.usable(key) and table.is_leased(key)
    assert table.landed(key) == 3 and table.usable(key)
    table.doom(key)
    assert not table.usable(key)
    table.close_lease(lease)
    with pytest.raises(ValueError, match="already released"):
        table.close_lease(lease)
    assert not table.is_leased(key)
    table._pending.add(ObjectKey("fp", b"\x01" * 16, ObjectKind.KV, 0, 8))  # a stray write
    with pytest.raises(IntegrityError, match="pending key is not indexed"):
        table.check()
