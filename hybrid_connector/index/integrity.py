"""Consistency of a ``CacheIndex`` (``check_index``): the radix tree's invariants, the
``StateTable``'s, and the links between them and the leases. Contract: reads only (under the
index's lock), never repairs; raises ``IntegrityError`` at the first violation found. For
tests, soaks and the server's health check, never on a request's path."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from hybrid_connector.tree.radix import IntegrityError

if TYPE_CHECKING:
    from hybrid_connector.index.state import IndexCore


def check_index(index: IndexCore) -> None:
    """Tree invariants, the table's (``StateTable.check``), plus: every ref is placed at
    its node, doomed keys are locked checkpoints, and every lock belongs to an active
    lease. Raises ``IntegrityError``."""
    with index.lock:
        index.tree.check_integrity()
        index.table.check()
        where = index.table.placement()
        seen = 0
        for node in index.tree.nodes():
            for r in [*node.kv.values(), *node.anchors.values(),
                      *([node.state] if node.state else [])]:
                seen += 1
                if where.get(r.key) != node.id:
                    raise IntegrityError(f"{r.key} not indexed at node {node.id}")
                if not index.owns(r.key.fingerprint):
                    raise IntegrityError(f"{r.key} has a foreign fingerprint")
        if seen != len(where):
            raise IntegrityError(f"{len(where) - seen} indexed keys are not in the tree")
        for key in index.table.doomed_keys():
            holder = index.tree.node(where.get(key, -1))
            if (holder is None or holder.state is None or holder.state.key != key
                    or not holder.state_lock):
                raise IntegrityError(f"doomed {key} is not a locked checkpoint")
        want: Counter[tuple[str, int]] = Counter()
        for lease in index.table.active_leases().values():
            want.update(("kv", n) for n in lease.kv_nodes)
            want.update(("anchor", n) for n in lease.anchor_nodes)
            if lease.state_node:
                want[("state", lease.state_node)] += 1
        for node in index.tree.nodes():
            for what, have in (("kv", node.kv_lock_own), ("state", node.state_lock),
                               ("anchor", node.anchor_lock)):
                if have != want[(what, node.id)]:
                    raise IntegrityError(f"{node}: {have} {what} locks, leases hold "
                                         f"{want[(what, node.id)]}")
