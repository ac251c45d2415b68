"""The O(N)-per-eviction reference for ``MarconiEviction`` (tests and benchmarks)."""

from __future__ import annotations

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.policies.eviction.marconi import MarconiEviction
from hybrid_connector.policies.eviction.marconi_terms import eligible, recency, structural_key
from hybrid_connector.tree.radix import Node


class FullWalkMarconi(MarconiEviction):
    """The O(N)-per-eviction reference: walks every node, computes every utility afresh.

    Same hooks and clock as ``MarconiEviction`` (so ``last_access`` evolves identically);
    only the choice differs in method, never in result.
    """

    name = "marconi_full_walk"

    def _choose(self, kind: ObjectKind) -> Node | None:
        if kind is ObjectKind.ANCHOR:
            return super()._choose(kind)
        cands = [n for n in self.tree.nodes() if eligible(n, kind) and self.evictable(n, kind)]
        self.scanned += len(self.tree)
        if not cands:
            return self._fallback(kind)
        now = self._now
        effs = {n.id: self.accounting.efficiency(*structural_key(n)) for n in cands}
        rs = {n.id: recency(now, n.last_access) for n in cands}
        rmin, rmax = min(rs.values()), max(rs.values())
        emin, emax = min(effs.values()), max(effs.values())
        return min(cands, key=lambda n: (
            self._utility(rs[n.id], effs[n.id], rmin, rmax, emin, emax, self.alpha), n.id))
