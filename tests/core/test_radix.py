import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tree.radix import IntegrityError, ObjectRef, RadixTree


def ref(kind, start, end, nbytes=10):
    return ObjectRef(ObjectKey("fp", bytes(16), kind, start, end), nbytes)


def lcp(a, b):
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def test_match_insert_split_basics():
    t = RadixTree()
    a = t.insert([1, 2, 3, 4, 5])
    assert t.match([1, 2, 3, 4, 5, 6]).length == 5
    m = t.match([1, 2, 9])
    assert (m.length, m.branch_point, m.partial) == (2, 2, a)
    assert len(t) == 1  # match has no side effects
    assert t.speculative_insert([1, 2, 9]) == 2 and t.speculative_insert([1, 2, 3, 4, 5, 6]) is None
    assert len(t) == 1
    t.add_kv(a, ref(ObjectKind.KV, 0, 2))
    t.add_kv(a, ref(ObjectKind.KV, 2, 5))
    t.set_state(a, ref(ObjectKind.STATE, 5, 5))
    b = t.insert([1, 2, 9])
    upper = b.parent
    assert upper.depth == 2 and upper is a.parent and a.id != upper.id
    assert set(upper.kv) == {2} and set(a.kv) == {5} and a.state is not None
    assert t.match([1, 2, 3, 4, 5]).branch_point is None
    t.check_integrity()


def test_locks_run_to_root_and_block_removal():
    t = RadixTree()
    a = t.insert([1, 2, 3])
    b = t.insert([1, 2, 3, 4, 5])
    t.lock_kv(b)
    assert a.kv_lock == 1 and b.kv_lock == 1 and t.root.kv_lock == 1
    with pytest.raises(ValueError):
        t.remove_leaf(b)
    t.lock_kv(b, -1)
    with pytest.raises(ValueError):
        t.lock_kv(b, -1)
    t.remove_leaf(b)
    assert t.node(b.id) is None and a.is_leaf
    t.check_integrity()


def test_merge_into_child_keeps_refs():
    t = RadixTree()
    t.insert([1, 2, 3, 4])
    mid = t.split(t.node_at([1, 2, 3, 4], 4), 2)
    t.add_kv(mid, ref(ObjectKind.KV, 0, 2))
    child = t.merge_into_child(mid)
    assert child.start == 0 and set(child.kv) == {2}
    t.check_integrity()


def test_integrity_detects_corruption():
    t = RadixTree()
    a = t.insert([1, 2, 3])
    t.add_kv(a, ref(ObjectKind.KV, 0, 3))
    a.kv[3] = ref(ObjectKind.KV, 0, 3, nbytes=99)  # bypass the counters
    with pytest.raises(IntegrityError):
        t.check_integrity()
    t2 = RadixTree()
    b = t2.insert([1, 2])
    b.kv_lock += 1
    with pytest.raises(IntegrityError):
        t2.check_integrity()


def test_refs_must_fit_their_node():
    t = RadixTree()
    a = t.insert([1, 2, 3])
    with pytest.raises(ValueError):
        t.add_kv(a, ref(ObjectKind.KV, 0, 4))
    with pytest.raises(ValueError):
        t.set_state(a, ref(ObjectKind.STATE, 2, 2))


tokens = st.lists(st.integers(0, 3), min_size=1, max_size=12)


class RadixMachine(RuleBasedStateMachine):
    """Random insert/match/lock/evict sequences against a brute-force model."""

    @initialize()
    def setup(self):
        self.tree = RadixTree()
        self.seqs: list[list[int]] = []
        self.locks: list[int] = []  # node ids with one KV lock each

    @rule(seq=tokens)
    def insert(self, seq):
        node = self.tree.insert(seq)
        assert node.depth == len(seq)
        assert list(self.tree.tokens_to(node)) == seq
        self.seqs.append(seq)

    @rule(seq=tokens)
    def match(self, seq):
        before = len(self.tree)
        m = self.tree.match(seq)
        # brute force: every node spells a prefix that is in the tree
        paths = [list(self.tree.tokens_to(n)) for n in self.tree.nodes()]
        assert m.length == max([lcp(seq, p) for p in paths] + [0])
        if m.partial is not None:
            assert m.partial.start < m.length < m.partial.depth
        assert len(self.tree) == before

    @precondition(lambda self: len(self.tree) > 0)
    @rule(data=st.data())
    def add_objects(self, data):
        node = data.draw(st.sampled_from(sorted(self.tree.nodes(), key=lambda n: n.id)))
        self.tree.add_kv(node, ref(ObjectKind.KV, node.start, node.depth, data.draw(st.integers(1, 50))))
        if data.draw(st.booleans()):
            self.tree.set_state(node, ref(ObjectKind.STATE, node.depth, node.depth, 7))
        if data.draw(st.booleans()):
            self.tree.add_anchor(node, ref(ObjectKind.ANCHOR, node.start, node.depth, 3))

    @precondition(lambda self: len(self.tree) > 0)
    @rule(data=st.data())
    def lock(self, data):
        node = data.draw(st.sampled_from(sorted(self.tree.nodes(), key=lambda n: n.id)))
        self.tree.lock_kv(node)
        self.locks.append(node.id)

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data):
        nid = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.tree.lock_kv(self.tree.node(nid), -1)

    @precondition(lambda self: len(self.tree) > 0)
    @rule(data=st.data())
    def evict(self, data):
        leaves = [n for n in self.tree.nodes() if n.is_leaf and n.kv_lock == 0]
        if leaves:
            victim = data.draw(st.sampled_from(sorted(leaves, key=lambda n: n.id)))
            held = victim.nbytes()
            before = sum(self.tree.bytes.values())
            refs = self.tree.remove_leaf(victim)
            assert sum(r.nbytes for r in refs) == held
            assert sum(self.tree.bytes.values()) == before - held
        else:
            for n in self.tree.nodes():
                assert n.kv_lock > 0 or not n.is_leaf

    @precondition(lambda self: len(self.tree) > 0)
    @rule(data=st.data())
    def drop_state_and_merge(self, data):
        node = data.draw(st.sampled_from(sorted(self.tree.nodes(), key=lambda n: n.id)))
        self.tree.drop_state(node)
        if len(node.children) == 1 and node.kv_lock_own == 0:
            child = self.tree.merge_into_child(node)
            assert self.tree.node(node.id) is None and self.tree.node(child.id) is child

    @invariant()
    def integrity(self):
        if hasattr(self, "tree"):
            self.tree.check_integrity()
            for nid in self.locks:
                assert self.tree.node(nid) is not None  # locked nodes never vanish


TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
