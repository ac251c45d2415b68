"""What an object is worth in each tier: ``tier_eviction: value`` (Policies v2).

Contract (``TierValue.__call__``, injected into the ledger as its
``hybrid_connector.tiers.ledger.value.ValueFn`` through the index's store hooks; the tiers never
import this module)::

    value(key, nbytes, tier, hits, age)
        = likelihood(hits, age) * (recompute_s(key) - nbytes / read_bps[tier]) / nbytes

the seconds one future hit served from ``tier`` saves over recomputing, times how likely
that hit is, per byte:

* ``recompute_s``: seconds the prefill of the tokens the object saves takes at the modeled
  compute rate (``recompute_tflops``, default 445 TFLOP/s: 989 x MFU 0.45, what the
  capacity benchmark models): the model's FLOPs (``ModelGeometry.flops_saved``, attention
  over its causal context) of ``[since, key.end)`` after ``since`` tokens. A KV chunk or an
  anchor page saves its own tokens (``since = key.start``); a state checkpoint saves the
  whole prefix its hit resumes after (``since = 0``). Crediting a state only with the
  tokens since the checkpoint above it (where a hit falls back without it) was measured
  worse: Marconi's tree eviction drops those intermediate checkpoints first, so the
  fallback is rarely there when the hit comes.
* ``nbytes / read_bps[tier]``: the time to load it from that tier (``tier_read_gbps``:
  device 1500, host 25, disk (tier ``nvme``) 6, remote 2 GB/s by default: the capacity
  benchmark's ``load_gbps``).
* ``likelihood``: ``(1 + hits) / (1 + age)`` from what the ledger tracks of the object (its
  uses, and ledger clock ticks since the last one or since it moved down into its tier,
  the recency its tier's LRU order keeps): frequency over recency.

Positive exactly when loading the object from the tier beats recomputing it. ``None``:
a tier this config does not know (the ledger then applies its LRU rules to the object).
Pure and cheap (one memoised FLOPs figure per distinct token span); called with the
store's lock held, it takes no lock.
"""

from __future__ import annotations

from collections.abc import Mapping

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.geometry.model import ModelGeometry

LEDGER_NAMES = {"device": "device", "host": "host", "disk": "nvme", "remote": "remote"}


def likelihood(hits: int, age: int) -> float:
    """Chance-like weight of one more hit: ``(1 + hits) / (1 + age)``."""
    return (1.0 + max(0, hits)) / (1.0 + max(0, age))


class TierValue:
    """``value(key, nbytes, tier, hits, age, since)`` per the module contract."""

    def __init__(self, geometry: ModelGeometry, read_bps: Mapping[str, float],
                 flops_per_s: float) -> None:
        if flops_per_s <= 0 or any(v <= 0 for v in read_bps.values()):
            raise ValueError("compute rate and read bandwidths must be positive")
        self.geometry = geometry
        self.read_bps = dict(read_bps)
        self.flops_per_s = float(flops_per_s)
        self._memo: dict[tuple[int, int], float] = {}
        self._by_key: dict[ObjectKey, float] = {}  # recompute seconds, asked per eviction

    @classmethod
    def from_config(cls, geometry: ModelGeometry, config: HybridConfig) -> TierValue:
        """Rates from ``tier_read_gbps`` (keyed by the ledger's tier names) and
        ``recompute_tflops``."""
        gbps = config.tier_read_gbps
        return cls(geometry, {LEDGER_NAMES[t]: getattr(gbps, t) * 1e9 for t in LEDGER_NAMES},
                   config.recompute_tflops * 1e12)

    def recompute_s(self, end: int, since: int) -> float:
        """Seconds to prefill ``[since, end)`` after a prefix of ``since`` tokens."""
        n = end - since
        if n <= 0:
            return 0.0
        got = self._memo.get((n, since))
        if got is None:
            if len(self._memo) >= 1 << 16:
                self._memo.clear()
            got = self._memo[(n, since)] = (
                self.geometry.flops_saved(n, since).total / self.flops_per_s)
        return got

    def __call__(self, key: ObjectKey, nbytes: int, tier: str, hits: int,
                 age: int) -> float | None:
        bps = self.read_bps.get(tier)
        if bps is None:
            return None
        r = self._by_key.get(key)
        if r is None:
            if len(self._by_key) >= 1 << 17:
                self._by_key.clear()
            r = self._by_key[key] = self.recompute_s(key.end, since_of(key))
        return _per_byte(r, nbytes, bps, hits, age)

    def span_value(self, end: int, since: int, nbytes: int, tier: str, hits: int,
                   age: int) -> float | None:
        """The module contract's value for an object whose tokens are given apart from its
        key (``[since, end)`` after ``since`` tokens; for keys that carry no token range,
        e.g. SGLang's page hashes). None: an unknown tier."""
        bps = self.read_bps.get(tier)
        if bps is None:
            return None
        return _per_byte(self.recompute_s(end, since), nbytes, bps, hits, age)


def _per_byte(recompute_s: float, nbytes: int, bps: float, hits: int, age: int) -> float:
    n = nbytes if nbytes > 0 else 1
    return likelihood(hits, age) * (recompute_s - n / bps) / n


def since_of(key: ObjectKey) -> int:
    """Where the tokens ``key`` saves begin: its own start for a KV chunk or an anchor
    page, 0 for a state (the hit it makes possible)."""
    return 0 if key.kind is ObjectKind.STATE else key.start
