"""``Simulator``: the real ``HybridCache`` over a ``SizeOnlyStore``, driven the way an engine
would, request by request. The policy simulator (``hybrid_connector.sim``) replays traces
with it and the alpha tuners score candidates with it (``runtime.tuner_caches``), which is
why it sits in the runtime layer, below the composition root that hands the tuners over.

For each request, in trace order (a logical clock, no concurrency, as the reference does),
a ``RequestSession`` runs it the way every engine integration does: lookup and load (the
engine then unlocks), KV chunks and the checkpoints admission asks for past the hit, the
rest of the KV and the final state at finish (see ``hybrid_connector.runtime.session`` for what an
engine can physically produce), plus anchor pages only for tokens it computed. Payloads
are zero-stride tensors of the real byte sizes from the geometry; a ``SizeOnlyStore`` only
accounts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType

import numpy as np
import torch

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.keys import ObjectKind, PrefixHasher
from hybrid_connector.geometry.anchors import configured_anchors
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.plan import SaveItem
from hybrid_connector.index.state import Policies
from hybrid_connector.policies import build
from hybrid_connector.policies.admission.anchors import anchor_block_bytes, anchor_pages
from hybrid_connector.policies.base import AdmissionPolicy, EvictionPolicy
from hybrid_connector.runtime.cache import HybridCache
from hybrid_connector.runtime.session import RequestSession
from hybrid_connector.tiers.size_only import Budget, SizeOnlyStore, zero_payload


@dataclass(frozen=True)
class StepResult:
    """One request's outcome: hit length, whether exact, bytes the hit loads, replay start."""

    prompt: int
    hit: int
    exact: bool
    loaded_bytes: int
    replay_from: int | None
    states_saved: int


anchor_page_bytes = anchor_block_bytes  # what one page's anchor block costs (policies.anchors)


class Simulator:
    """One cache over a ``SizeOnlyStore``; ``step`` replays one request.

    ``anchors``: save anchor pages (``config.anchor_page_size``, ``config.anchor_density``)
    for computed tokens; they produce (approximate) hits only when ``config.replay`` is on.
    ``close()`` (or leaving a ``with`` block) closes the cache and so its policies; the
    statistics stay readable.
    """

    def __init__(
        self,
        config: HybridConfig,
        geometry: ModelGeometry,
        budget: Budget,
        eviction: EvictionPolicy | None = None,
        admission: AdmissionPolicy | None = None,
        anchors: bool = False,
    ) -> None:
        self.config = config
        self.geometry = geometry
        self.store = SizeOnlyStore(budget)
        # Without an eviction policy: the configured one, whose auto alpha then stays at 0
        # (the simulator's baselines build their own tuner, see ``baselines``).
        self.cache = HybridCache(config, geometry, self.store,
                                 Policies(eviction or build.eviction(config),
                                          admission or build.admission(config)))
        self.anchors = anchors
        self.kv_tok = geometry.kv_bytes_per_token()
        self.state_bytes = geometry.state_bytes()
        self.page, density = configured_anchors(config)  # density 0: one position per page
        self.anchor_bytes = anchor_page_bytes(geometry, self.page, density)
        self.states_saved = 0

    def close(self) -> None:
        self.cache.close()

    def __enter__(self) -> Simulator:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _kv(self, start: int, end: int) -> torch.Tensor:
        return zero_payload((end - start) * self.kv_tok)

    def _anchor_pages(self, lo: int, hi: int) -> list[SaveItem]:
        """Anchor blocks for the computed pages fully inside ``[lo, hi)``."""
        return [
            SaveItem(ObjectKind.ANCHOR, s, e, zero_payload(self.anchor_bytes))
            for s, e in anchor_pages(lo, hi, self.page)
        ]

    def step(self, inp: np.ndarray, out: np.ndarray, ahead: PrefixHasher | None = None
             ) -> StepResult:
        """One request through a ``RequestSession``, as an engine runs it. ``ahead``: the
        prefix hashes of ``inp`` + ``out``, when the caller has them (``RequestSession``)."""
        n = int(inp.size)
        s = RequestSession(self.cache, inp, ahead=ahead)
        s.load()
        s.release()
        plan, p = s.plan, s.hit
        states = {q: zero_payload(self.state_bytes) for q in s.checkpoints}
        s.save_prefill(self._kv, states, self._anchor_pages(p, n) if self.anchors else ())
        if out.size:
            s.extend(out)
        m = len(s.hasher)
        extra = self._anchor_pages(max(p, n - n % self.page), m) if self.anchors else ()
        s.finish(self._kv, {m: zero_payload(self.state_bytes)}, extra)
        self.states_saved += len(states) + 1
        return StepResult(
            n, p, plan.exact, plan.nbytes if p else 0,
            None if plan.exact else plan.replay_from, len(states) + 1,
        )
