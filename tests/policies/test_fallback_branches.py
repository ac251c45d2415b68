"""``fallback_states`` counts a branch off a chain between two states as a hit a fallback
state would have served (``eviction.marconi_victims``). An agent's retry leaves its chain
inside the last action and observation, below the previous turn's state: once that state
was taken, the retry hits far above and no hit ever landed on a fallback, so the share of
fallback hits stayed near 0 and every fallback state kept going before KV (one request at a
time, agents lost whole prefixes on their retries). Each such branch now counts once."""

from __future__ import annotations

import numpy as np
from chains import GEO, chain

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.policies.eviction.marconi import MarconiEviction
from hybrid_connector.policies.eviction.marconi_victims import shadowed
from hybrid_connector.tree.radix import Node, RadixTree


def _setup() -> tuple[MarconiEviction, Node, Node]:
    """A session's fallback state (1,000 tokens) above its answer's state, hit twice."""
    tree = RadixTree()
    fallback, tip = chain(tree, np.arange(1008) + 10, (1000, 1008))
    pol = MarconiEviction(alpha=0.0, scan_resistant=True, fallback_first=True)
    pol.bind(tree, GEO, lambda n, k: (not n.children) if k is ObjectKind.KV
             else n.state is not None)
    for t in (1.0, 2.0):
        pol.on_access(tree.path_to(tip), t)
        tip.hits += 1  # as the index counts a hit, after ``on_access``
    assert shadowed(fallback)
    return pol, fallback, tip


def _retry(pol: MarconiEviction, agent: int, now: float) -> None:
    """Agent ``agent``'s chain (states at 400 and 600) and its retry, which leaves the
    chain at 500 (no state there); the retry's access ends at its own new leaf."""
    tokens = np.arange(600) + 100_000 * (agent + 1)
    chain(pol.tree, tokens, (400, 600))
    leaf = pol.tree.insert(np.r_[tokens[:500], np.arange(50) + 5_000_000 + 1_000 * agent])
    assert leaf.parent is not None and len(leaf.parent.children) == 2
    pol.on_access(pol.tree.path_to(leaf), now)


def test_retries_leaving_chains_between_states_keep_a_long_fallback() -> None:
    """Ten retries, each off a chain between its states: the fallback keeps 1,000 tokens
    of KV usable, so KV goes first. Before, only hits that landed on a fallback counted
    (none here), and the fallback state went first."""
    pol, fallback, _ = _setup()
    for agent in range(10):
        _retry(pol, agent, 3.0 + agent)
    assert pol.victim_kinds((ObjectKind.KV, ObjectKind.STATE))[0] is ObjectKind.KV
    assert fallback.state is not None


def test_one_branch_counts_once() -> None:
    """The same retry's path accessed again (its next turns) is one branch: the fallback
    still goes first."""
    pol, fallback, _ = _setup()
    _retry(pol, 0, 3.0)
    leaf = max(pol.tree.nodes(), key=lambda n: n.id)
    for t in range(4, 14):
        pol.on_access(pol.tree.path_to(leaf), float(t))
    assert pol.victim_kinds((ObjectKind.KV, ObjectKind.STATE))[0] is ObjectKind.STATE
    assert pol.next_victim(ObjectKind.STATE) is fallback
