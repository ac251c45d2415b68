"""``fallback_states`` weighs a fallback state by where hits land
(``eviction.marconi_victims``). A fallback state (a deeper state below it on its
single-child chain) goes before any KV only while the KV it keeps usable (its tokens above
the next state or branch up), times the share of state hits that landed on fallback
states, is worth less than what its bytes would hold in KV. Sessions that extend their
whole context hit the deepest state, so their fallbacks still go first; a client whose
next prompt leaves the chain at a fallback (Mooncake's replay: the next turn drops the
previous prompt's partial last block; a client that does not resend answers) keeps the
state its next hit lands on."""

from __future__ import annotations

import numpy as np
from chains import GEO, chain

from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.policies.eviction.marconi import MarconiEviction
from hybrid_connector.policies.eviction.marconi_victims import shadowed
from hybrid_connector.tree.radix import Node, RadixTree


def _setup() -> tuple[MarconiEviction, Node, Node]:
    """A session's prompt end (1,000 tokens, its state a fallback) with the state of its
    8-token answer below, and another session's leaf."""
    tree = RadixTree()
    fallback, tip = chain(tree, np.arange(1008) + 10, (1000, 1008))
    chain(tree, np.arange(600) + 100_000, (600,))
    pol = MarconiEviction(alpha=0.0, scan_resistant=True, fallback_first=True)
    pol.bind(tree, GEO, lambda n, k: (not n.children) if k is ObjectKind.KV
             else n.state is not None)
    assert shadowed(fallback) and not shadowed(tip)
    return pol, fallback, tip


def _hit(pol: MarconiEviction, node: Node, now: float) -> None:
    pol.on_access(pol.tree.path_to(node), now)
    node.hits += 1  # as the index counts a hit, after ``on_access``


def test_with_hits_on_the_deepest_state_a_fallback_goes_before_kv() -> None:
    pol, _, tip = _setup()
    for t in range(1, 5):
        _hit(pol, tip, float(t))
    assert pol.victim_kinds((ObjectKind.KV, ObjectKind.STATE))[0] is ObjectKind.STATE
    assert pol.next_victim(ObjectKind.STATE) is tip.parent


def test_with_hits_on_fallbacks_a_long_fallback_stays_before_kv() -> None:
    """Hits landed on the fallback itself (the next prompts left the chain there): it keeps
    1,000 tokens of KV usable, more than its bytes would hold, so a leaf's KV goes first.
    Before, a fallback state went first wherever hits landed."""
    pol, fallback, _ = _setup()
    for t in range(1, 5):
        _hit(pol, fallback, float(t))
    assert pol.victim_kinds((ObjectKind.KV, ObjectKind.STATE))[0] is ObjectKind.KV
