"""Scan resistance for tree eviction: LIRS's protected set, ARC's adaptive room, ghosts.

Recency alone thrashes when prefixes come back in a cycle a little longer than the budget
holds (multi-round QA one request at a time: ten users in turn, room for nine): the least
recently used prefix is always the next one asked for. The guard splits the indexed nodes
into two classes and remembers what eviction took (*ghosts*):

* **proven** (LIRS's LIR set): nodes a hit landed on (``Node.hits``), a save's extension of
  a proven leaf (a follow-up turn), and a chain a save hangs where a ghost says the cache
  evicted the same prefix before; **unproven**: every other node.
* A node joins the proven class only while that class has room (the capacity, the most
  bytes the tree has held, less ``room`` left to the unproven and at least two prefixes of
  its size), or in place of the least recent proven leaf when that leaf has gone unused for
  longer than the newcomer's reuse interval (LIRS: the shorter interval is the hotter
  prefix); the displaced leaf turns unproven. So in a cycle the proven set stays put and
  hits every turn, and only the rest thrashes.
* A leaf proven on its ghost (a chain re-created where an evicted one hung) turns unproven
  again once no access has reached it while the tree took in one capacity, as long as
  fewer hits have landed on proven nodes than on unproven ones over the run (looked for
  whenever the unproven go first, at most every 1/16 capacity of intake): plain recency
  would have let it go by then, and the protection is not paying. Any other proven leaf
  (proven by a hit, or a follow-up's extension of one) idle as long turns unproven too
  while fewer hits landed on proven nodes than on unproven ones over the last capacity of
  intake (not the run: a cycle still being protected in, before its proven hits come,
  keeps its leaves). In the Mooncake replay
  conversations come back once at 1-2x the capacity, are proven on their ghosts, shrink
  ``room`` and then mostly never return; kept proven, they filled the budget while new
  conversations were evicted before their follow-ups. A protected cycle keeps its
  prefixes: each is reused within a capacity of intake, since its hits take in only the
  turn's new tokens.
* ``room`` (ARC's p): the bytes the unproven class may hold before it goes first. It starts
  at the capacity (the policy's own ranking over everything: plain recency, no class
  first) and moves on ghosts: a re-created prefix whose reuse distance (bytes the tree
  took in since its last use) was below the capacity would have stayed under recency
  alone, so ``room`` grows by its bytes; one whose distance was beyond it is a loop longer
  than the budget, so ``room`` shrinks by twice its bytes (protect the proven from it).

``victim_class``: False (evict among the unproven first) while they hold more than
``room``, else None (the ranking over both). A ghost's identity is where the evicted chain
hung: the id of the ancestor that survives its eviction (a state, a branch or the root)
and the first token below it; a save that hangs a new chain at the same place with the same
token re-creates it. Ghost bytes are kept up to twice the capacity (FIFO). Metadata only;
O(chain length) per created or evicted node, O(proven leaves) per promotion into a full set,
O(proven nodes) per look for idle leaves.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import NamedTuple

from hybrid_connector.tree.radix import Node

GhostKey = tuple[int, int]
SWEEP = 16  # idle proven leaves are looked for at most every 1/SWEEP capacity of intake
IDLE = 1.0  # ... and turn unproven after IDLE capacities of intake without an access
RECENT = 1 << 17  # hits remembered for the last capacity's tally (hits that take in no
# bytes do not move the window on: this bounds it; ~11 MB at most)


class Ghost(NamedTuple):
    """What eviction took: when it was last used (policy clock and bytes taken in) and
    its bytes."""

    last: float
    stamp: float
    nbytes: int


class ScanGuard:
    """The class of every indexed node, the ghosts and ``room`` (module docstring)."""

    def __init__(self) -> None:
        self.proven: set[int] = set()
        self._nodes: dict[int, Node] = {}
        self._bytes: dict[int, tuple[bool, int]] = {}  # node id -> (proven, bytes) counted
        self._born: dict[int, float] = {}  # node id -> policy clock at creation
        self._stamp: dict[int, float] = {}  # node id -> ``taken_in`` at its last use
        self.proven_bytes = 0
        self.unproven_bytes = 0
        self.capacity = 0
        self.taken_in = 0.0  # bytes the tree took in so far (the reuse-distance clock)
        self._room: float | None = None  # None: the capacity
        self._ghosts: OrderedDict[GhostKey, Ghost] = OrderedDict()
        self._ghost_bytes = 0
        self.ghost_hits = 0
        self.promoted = 0
        self.demoted = 0
        self.aged = 0  # ghost-proven leaves turned unproven for idling (``_demote_idle``)
        self._made: dict[int, float] = {}  # node id -> ``taken_in`` at its creation
        self._ghosted: set[int] = set()  # nodes proven on a ghost's re-creation
        self._swept = 0.0  # ``taken_in`` at the last look for idle ghost-proven leaves
        self._hits_seen: dict[int, int] = {}  # node id -> ``Node.hits`` at its last refresh
        self.proven_hits = 0  # hits that landed on a proven node ...
        self.unproven_hits = 0  # ... and on an unproven one
        self._recent: deque[tuple[float, bool]] = deque()  # (``taken_in``, proven) per hit
        self._recent_hits = [0, 0]  # ... of those in the last capacity: unproven, proven

    @property
    def room(self) -> float:
        return float(self.capacity) if self._room is None else self._room

    def victim_class(self) -> bool | None:
        """False: evict among the unproven first; None: rank over both."""
        if self.unproven_bytes > self.room:
            self._demote_idle()
        return False if self.unproven_bytes > self.room else None

    def _recent_losing(self) -> bool:
        """Fewer hits landed on proven nodes than on unproven ones over the last capacity
        of intake."""
        limit = self.taken_in - self.capacity
        while self._recent and self._recent[0][0] < limit:
            self._recent_hits[self._recent.popleft()[1]] -= 1
        return self._recent_hits[1] < self._recent_hits[0]

    def _demote_idle(self) -> None:
        """Proven leaves no access reached over ``IDLE`` capacities of intake turn unproven
        while the protection is not paying (module docstring): ghost-proven ones on the
        hits over the run, the others on the hits over the last capacity of intake."""
        if self.taken_in - self._swept < self.capacity / SWEEP:
            return
        run, recent = self.proven_hits < self.unproven_hits, self._recent_losing()
        if not (run or recent):
            return
        self._swept = self.taken_in
        limit = self.taken_in - IDLE * self.capacity
        for nid in list(self.proven):
            n = self._nodes.get(nid)
            if (n is not None and (run if nid in self._ghosted else recent)
                    and not n.children
                    and self._stamp.get(nid, self._made.get(nid, 0.0)) < limit):
                self._count(n, False)
                self.aged += 1

    def is_proven(self, node: Node) -> bool:
        return node.id in self.proven

    # ----------------------------------------------------------------- classes
    def created(self, nodes: list[Node], first_new: int, now: float) -> None:
        """Classify nodes the tree created since the last sync (ids >= ``first_new``)."""
        decided: dict[GhostKey, bool] = {}
        ghosted: set[GhostKey] = set()  # keys a ghost was found at
        for node in nodes:
            self._born[node.id] = now
            self._made[node.id] = self.taken_in
            old_child = next((c for c in node.children.values() if c.id < first_new), None)
            if old_child is not None:  # the upper half of a split: as the node it split
                proven = old_child.id in self.proven
            else:
                top = node
                while top.parent is not None and top.parent.id >= first_new:
                    top = top.parent
                anchor = top.parent
                if anchor is None or top.tokens.size == 0:
                    continue
                key = (anchor.id, int(top.tokens[0]))
                if key not in decided:
                    if key in self._ghosts:
                        ghosted.add(key)
                    decided[key] = self._arrival(key, anchor, now)
                proven = decided[key]
                if proven and key in ghosted:
                    self._ghosted.add(node.id)
            if proven:
                self.proven.add(node.id)

    def _arrival(self, key: GhostKey, anchor: Node, now: float) -> bool:
        """Whether a chain a save hung at ``key`` starts proven (module docstring)."""
        ghost = self._ghosts.pop(key, None)
        if ghost is None:  # a save extending a proven leaf continues a proven prefix
            return (anchor.parent is not None and anchor.id in self.proven
                    and len(anchor.children) == 1)
        self._ghost_bytes -= ghost.nbytes
        self.ghost_hits += 1
        if self.taken_in - ghost.stamp < self.capacity:  # recency alone would have kept it
            self._room = min(float(self.capacity), self.room + ghost.nbytes)
        else:  # a loop longer than the budget: protect the proven from it
            self._room = max(0.0, self.room - 2 * ghost.nbytes)
        return self._admit(ghost.nbytes, now - ghost.last, now)

    def _admit(self, nbytes: int, reuse: float, now: float) -> bool:
        """Whether a prefix used again ``reuse`` ticks after its previous use joins the
        proven class (module docstring)."""
        if self.proven_bytes + nbytes <= self.capacity - max(self.room, 2 * nbytes):
            self.promoted += 1
            return True
        oldest: Node | None = None
        for nid in self.proven:
            n = self._nodes.get(nid)
            if n is not None and not n.children and (
                    oldest is None or n.last_access < oldest.last_access):
                oldest = n
        if oldest is not None and now - oldest.last_access > reuse:
            self._count(oldest, False)
            self.demoted += 1
            self.promoted += 1
            return True
        return False

    def refresh(self, node: Node, total_bytes: int, now: float) -> None:
        """Recount ``node`` (a hit may prove it) and track the capacity."""
        self._nodes[node.id] = node
        if node.hits > self._hits_seen.get(node.id, 0):  # a hit, counted in its class
            self._hits_seen[node.id] = node.hits
            proven = node.id in self.proven
            if proven:
                self.proven_hits += 1
            else:
                self.unproven_hits += 1
            self._recent.append((self.taken_in, proven))
            self._recent_hits[proven] += 1
            if len(self._recent) > RECENT:
                self._recent_hits[self._recent.popleft()[1]] -= 1
            self._recent_losing()  # drops the hits older than a capacity
        self.capacity = max(self.capacity, total_bytes)
        if node.hits > 0 and node.id not in self.proven and self._admit(
                node.nbytes(), now - self._born.get(node.id, now), now):
            self.proven.add(node.id)
        self._count(node, node.id in self.proven)

    def _count(self, node: Node, proven: bool) -> None:
        (self.proven.add if proven else self.proven.discard)(node.id)
        nbytes = node.nbytes()
        old = self._bytes.get(node.id)
        if old is not None:
            self._uncount(old)
        self.taken_in += max(0, nbytes - (old[1] if old is not None else 0))
        self._bytes[node.id] = (proven, nbytes)
        if proven:
            self.proven_bytes += nbytes
        else:
            self.unproven_bytes += nbytes

    def _uncount(self, old: tuple[bool, int]) -> None:
        if old[0]:
            self.proven_bytes -= old[1]
        else:
            self.unproven_bytes -= old[1]

    def used(self, node: Node) -> None:
        """``node`` was the deepest node of an access (its reuse distance restarts)."""
        self._stamp[node.id] = self.taken_in

    def removed(self, node_id: int) -> None:
        self.proven.discard(node_id)
        self._nodes.pop(node_id, None)
        self._born.pop(node_id, None)
        self._stamp.pop(node_id, None)
        self._made.pop(node_id, None)
        self._hits_seen.pop(node_id, None)
        self._ghosted.discard(node_id)
        old = self._bytes.pop(node_id, None)
        if old is not None:
            self._uncount(old)

    # ----------------------------------------------------------------- ghosts
    def evicting(self, leaf: Node) -> None:
        """``leaf`` is about to leave with the stateless single-child chain above it:
        remember where it hung, when it was last used and its bytes."""
        nbytes = 0
        top = leaf
        while True:
            nbytes += top.nbytes()
            up = top.parent
            if (up is None or up.parent is None or up.state is not None
                    or len(up.children) != 1 or up.anchors):
                break
            top = up
        if top.parent is None or top.tokens.size == 0:
            return
        key = (top.parent.id, int(top.tokens[0]))
        old = self._ghosts.pop(key, None)
        if old is not None:
            self._ghost_bytes -= old.nbytes
        self._ghosts[key] = Ghost(leaf.last_access, self._stamp.get(leaf.id, self.taken_in),
                                  nbytes)
        self._ghost_bytes += nbytes
        while self._ghost_bytes > max(2 * self.capacity, nbytes):
            _, g = self._ghosts.popitem(last=False)
            self._ghost_bytes -= g.nbytes
