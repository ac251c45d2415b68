"""FLOP-aware eviction behind SGLang's hash-only storage calls (no SGLang import).

SGLang's L3 calls name pages by chained hashes only; with ``"hicache_storage_pass_prefix_keys":
true`` in its storage extra config, every call also carries ``prefix_keys``: the hashes of
the pages before the call's keys (for every transfer, ``prefix_keys + keys`` is one
contiguous chain from the root: ``hybrid_cache_controller._trailing_chain_groups``). That
is enough to rebuild what Marconi's eviction needs from a radix tree:

* ``PageChain``: per page, its depth (pages from the root; the page ends at token
  ``depth x page_size``), its parent page and how many stored states lie at or below it;
* ``ChainValue``: the ledger's ``tier_value`` hook (``tier_eviction: value``,
  ``hybrid_connector.tiers.ledger.value``) for SGLang's keys: a MAMBA state is worth the prefill of its
  whole prefix (the hit it makes possible), a KV page the prefill of its own page of
  tokens after ``depth - 1`` pages of context, both from ``policies.tier_value`` (the
  model's FLOPs at the modeled compute rate, minus the tier's load time, times the
  likelihood of one more hit from uses and age, per byte): as in Marconi, what saves more
  FLOPs per byte stays longer. And the hybrid hit rule: an L3 hit ends at a page whose
  state L3 holds, so a KV page serves as many hits as there are stored states at or below
  it on its chains: its value is multiplied by that count, and a page with none can be
  part of no hit: it is worth 0, the first victim of its window, and is dropped rather
  than demoted (``hybrid_connector.tiers.ledger.value``: nothing of value to keep). Measured against the
  LRU default in ``benchmarks/sglang_eviction.py`` (mixed: see the README).

Keys the chain has no depth for (stored while SGLang did not pass ``prefix_keys``, or of
another model) are unknown to the hook (``None``): the ledger's LRU rules apply to them.
Thread safety: SGLang calls the backend from several threads (backup, prefetch) and the
ledger asks the hook with the store's lock held; ``PageChain`` has its own lock, held only
for its own updates (an O(depth) walk at most; it never calls out while holding it), and
the hook's reads take none (a count read during a concurrent update is off by one at
most: a ranking hint, never a correctness question).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.integrations.sglang.keys import hash_bytes
from hybrid_connector.policies.eviction.tier_value import TierValue


@dataclass
class _Page:
    depth: int
    parent: bytes | None
    kv: bool = False  # its KV page is stored
    state: int = 0  # ancestors counted for the stored state at its end (0: none stored)
    below: int = 0  # stored states at or below this page


class PageChain:
    """Depths, parents and states below SGLang page hashes (module docstring).

    ``learn`` records the chain a call names; ``stored``/``dropped`` follow what the store
    holds. A page is kept while its KV or its state is stored or a stored state lies below
    it (it links that state to the root); pages learned but never stored are remembered up
    to ``KNOWN_MAX`` at a time. Memory: O(stored KV pages + stored states x depth)."""

    KNOWN_MAX = 1 << 17

    def __init__(self) -> None:
        self._pages: dict[bytes, _Page] = {}
        self._known: dict[bytes, tuple[int, bytes | None]] = {}  # learned, not kept
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._pages)

    def learn(self, prefix_keys: Sequence[str] | None, hashes: Sequence[str]) -> None:
        """Record that ``prefix_keys + hashes`` is one chain from the root (page i of it at
        depth i + 1). ``prefix_keys`` None (SGLang not told to pass them): nothing is
        learned. ValueError for a malformed hash. O(length of the chain)."""
        if prefix_keys is None or not hashes:
            return
        chain = [hash_bytes(h) for h in (*prefix_keys, *hashes)]
        with self._lock:
            if len(self._known) + len(chain) > self.KNOWN_MAX:
                self._known.clear()
            parent: bytes | None = None
            for depth, b in enumerate(chain, 1):
                if b not in self._pages:
                    self._known[b] = (depth, parent)
                parent = b

    def _page(self, b: bytes) -> _Page | None:
        page = self._pages.get(b)
        if page is None:
            known = self._known.pop(b, None)
            if known is not None:
                page = self._pages[b] = _Page(*known)
        return page

    def stored(self, kind: ObjectKind, prefixes: Iterable[bytes]) -> None:
        """The store now holds these pages' KV (``ObjectKind.KV``) or states. A page of
        unknown depth is skipped (the ledger's LRU rules apply to it)."""
        with self._lock:
            for b in prefixes:
                page = self._page(b)
                if page is None:
                    continue
                if kind is ObjectKind.KV:
                    page.kv = True
                elif not page.state:
                    page.state = self._count(page)

    def _count(self, page: _Page) -> int:
        """Count a state stored at ``page`` in ``below`` of it and of its ancestors as far
        as they are known; how many pages that is (``_uncount`` takes exactly those)."""
        n = 0
        p: _Page | None = page
        while p is not None:
            p.below += 1
            n += 1
            p = self._page(p.parent) if p.parent is not None else None
        return n

    def dropped(self, kind: ObjectKind, prefixes: Iterable[bytes]) -> None:
        """The store no longer holds these pages' KV or states (evicted, removed)."""
        with self._lock:
            for b in prefixes:
                page = self._pages.get(b)
                if page is None:
                    continue
                if kind is ObjectKind.KV:
                    page.kv = False
                    self._release(b, page)
                elif page.state:
                    self._uncount(b, page)

    def _uncount(self, b: bytes, page: _Page) -> None:
        """Take the state of page ``b`` out of the counts it added to (every counted
        ancestor is still kept: its ``below`` was > 0), releasing pages left for nothing."""
        levels, page.state = page.state, 0
        k: bytes | None = b
        p: _Page | None = page
        for _ in range(levels):
            if p is None or k is None:
                break
            p.below -= 1
            parent = p.parent
            self._release(k, p)
            k, p = parent, (self._pages.get(parent) if parent is not None else None)

    def _release(self, b: bytes, page: _Page) -> None:
        if not page.kv and not page.state and page.below <= 0:
            self._pages.pop(b, None)

    def clear(self) -> None:
        """Forget every page (the store was cleared)."""
        with self._lock:
            self._pages.clear()
            self._known.clear()

    def depth(self, prefix: bytes) -> int | None:
        """Pages from the root to the end of the page (None: unknown)."""
        page = self._pages.get(prefix)
        return None if page is None else page.depth

    def states_below(self, prefix: bytes) -> int:
        """Stored states at or below this page on its chains (0 for an unknown page)."""
        page = self._pages.get(prefix)
        return 0 if page is None else page.below

    def check_integrity(self) -> None:
        """AssertionError unless every kept page is stored or links a stored state, and
        every ``below`` equals the stored states whose counted ancestors include it."""
        with self._lock:
            want = dict.fromkeys(self._pages, 0)
            for b, page in self._pages.items():
                assert page.kv or page.state or page.below > 0, "a page kept for nothing"
                n, k = 0, b
                p: _Page | None = page
                while p is not None and n < page.state:
                    want[k] += 1
                    n += 1
                    if p.parent is None:
                        break
                    k, p = p.parent, self._pages.get(p.parent)
                assert n == page.state, "a state's counted ancestors are gone"
            for b, page in self._pages.items():
                assert page.below == want[b], f"below {page.below} != {want[b]}"
                if page.parent is not None and page.parent in self._pages:
                    assert self._pages[page.parent].depth == page.depth - 1, "a broken link"


class ChainValue:
    """The ``tier_value`` hook (``hybrid_connector.tiers.ledger.value.ValueFn``) for SGLang's keys of one
    rank (``fingerprints``), per the module docstring. Pure: reads the chain, never
    mutates; takes no lock but the chain's dictionary reads."""

    def __init__(self, chain: PageChain, value: TierValue, page_size: int,
                 fingerprints: Iterable[str]) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.chain, self.value, self.page_size = chain, value, page_size
        self.fingerprints = frozenset(fingerprints)

    def __call__(self, key: ObjectKey, nbytes: int, tier: str, hits: int,
                 age: int) -> float | None:
        if key.fingerprint not in self.fingerprints:
            return None
        depth = self.chain.depth(key.prefix)
        if depth is None:
            return None
        end = depth * self.page_size
        if key.kind is not ObjectKind.KV:
            return self.value.span_value(end, 0, nbytes, tier, hits, age)
        below = self.chain.states_below(key.prefix)
        if below <= 0:
            return 0.0  # no state ends at or after it: part of no L3 hit
        v = self.value.span_value(end, end - self.page_size, nbytes, tier, hits, age)
        return v * below if v is not None and v > 0 else v  # each state below needs it
