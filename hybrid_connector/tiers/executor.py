"""``Executor``: the worker side. Runs the ledger's ops on this process's tiers and reads
objects from them; it decides nothing.

Two lanes keep a slow store from stalling the rest: local ops (device, host, NVMe) run in
submission order on one thread, so a demotion always lands before the put that needed its
room, and ops on the shared tier (a remote store) run in order on another, except those
that free or fill local room (a promotion's take from it, a demotion into it: local lane).
Consecutive puts to one tier go as one batch (one fsync round, one pipeline).
``inline=True`` runs everything in the caller's thread (the simulator, tests, a store used
without an index).

Reads run in the caller's thread, concurrently with the lanes: a read tries the tier the
plan named, then every other tier (an object may be mid-move), so it never depends on the
lanes' progress. Nothing here raises for store failures: an op that did not fully happen
reports False (a failed put or move leaves no copy behind, see ``hybrid_connector.tiers.ops``), a read that
failed is None.

Metadata (``ObjectMeta``) travels with the bytes: a ``Put`` stores the metadata given to
``submit`` for its key (or, for a taken object, the metadata it was taken with), and a
``Move`` or ``Take`` carries the source copy's metadata to the destination.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from hybrid_connector.core.keys import ObjectKey
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.tiers.ops import Move, Op, Put, Record, Remove, Take
from hybrid_connector.tiers.tier import Tier

log = logging.getLogger(__name__)
Done = Callable[[list[int], list[bool]], None]


class Executor:
    """Carries out ops on ``tiers`` (unique names; ``shared``: the name of the shared tier,
    if any). Payloads handed to ``submit`` belong to the executor until its future is done
    (they must not be modified before)."""

    def __init__(self, tiers: Sequence[Tier], shared: str | None = None, inline: bool = False,
                 device: torch.device | str = "cpu") -> None:
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        if shared is not None and shared not in names:
            raise ValueError(f"shared tier {shared!r} is not one of {names}")
        self.tiers = {t.name: t for t in tiers}
        self.shared = shared
        self._stash: dict[ObjectKey, torch.Tensor] = {}  # taken, not yet put back (lane-owned)
        self._taken_from: dict[ObjectKey, str] = {}
        self._stash_meta: dict[ObjectKey, ObjectMeta] = {}  # metadata of stashed objects
        # Bumped each time an object has landed in a new place (stash or tier) and before
        # it leaves the old one, so a read that missed can tell it raced with a move.
        self._relocations = 0
        self._rank = {name: i for i, name in enumerate(self.tiers)}
        self.promotions: Counter[str] = Counter()  # objects moved to a faster tier, by kind
        self.demotions: Counter[str] = Counter()   # to a slower one
        self.inline = inline
        self.device = torch.device(device)
        self._lanes: dict[str, ThreadPoolExecutor] = {}
        if not inline:
            self._lanes = {"local": ThreadPoolExecutor(1, thread_name_prefix="hc-ops"),
                           "shared": ThreadPoolExecutor(1, thread_name_prefix="hc-remote")}

    # ------------------------------------------------------------------ ops
    def submit(self, ops: Sequence[Op], payloads: Mapping[ObjectKey, torch.Tensor],
               done: Done | None = None, metas: Mapping[ObjectKey, ObjectMeta] | None = None
               ) -> Future[list[bool]]:
        """Run ``ops``; the future gives their results in order. ``done(indices, results)``
        is called once per lane as soon as that lane's ops ran (local ops do not wait for
        the shared tier's), on the lane's thread, before the future completes. ``metas``:
        the metadata of the payloads' keys, stored by their puts (keys without: none)."""
        ops = list(ops)
        metas = metas or {}
        results: list[bool] = [False] * len(ops)
        lanes: dict[str, list[int]] = {"local": [], "shared": []}
        for i, op in enumerate(ops):
            lanes["shared" if self._on_shared(op) else "local"].append(i)
        fut: Future[list[bool]] = Future()
        pending = [name for name, idx in lanes.items() if idx]
        if not pending:
            fut.set_result(results)
            return fut

        def run(name: str) -> None:
            idx = lanes[name]
            try:
                self._run([ops[i] for i in idx], payloads, idx, results, metas)
            finally:
                try:
                    if done is not None:
                        done(idx, [results[i] for i in idx])
                except Exception:  # a completion hook must not lose the result
                    log.exception("op completion callback failed")
                pending.remove(name)
                if not pending:
                    fut.set_result(results)

        for name in list(pending):
            if self.inline:
                run(name)
            else:
                self._lanes[name].submit(run, name)
        return fut

    def _on_shared(self, op: Op) -> bool:
        # Anything touching the shared tier runs on its lane, except a promotion's take
        # from it (the take and the put that follows must stay on one lane, in order) and
        # a demotion into it (it frees local room the local puts after it need).
        if isinstance(op, Move):
            return op.src == self.shared
        if isinstance(op, Take):
            return False
        return op.tier == self.shared

    def _run(self, ops: list[Op], payloads: Mapping[ObjectKey, torch.Tensor],
             where: list[int], results: list[bool],
             metas: Mapping[ObjectKey, ObjectMeta]) -> None:
        i = 0
        while i < len(ops):
            op = ops[i]
            if isinstance(op, Put):
                j = i
                while j < len(ops) and isinstance(nxt := ops[j], Put) and nxt.tier == op.tier:
                    j += 1
                batch = [o.key for o in ops[i:j]]
                for n, ok in enumerate(self._put(op.tier, batch, payloads, metas)):
                    results[where[i + n]] = ok
                i = j
                continue
            if isinstance(op, Move):
                results[where[i]] = self._move(op)
            elif isinstance(op, Take):
                results[where[i]] = self._take(op)
            elif isinstance(op, Record):
                put_failed = any(isinstance(o, Put) and o.key == op.key and o.tier == op.tier
                                 and not results[where[k]] for k, o in enumerate(ops[:i]))
                results[where[i]] = not put_failed and self._record(op)
            else:
                results[where[i]] = self._remove(op)
            i += 1

    def _tier(self, name: str) -> Tier | None:
        t = self.tiers.get(name)
        if t is None:
            log.error("op names unknown tier %r (have %s)", name, list(self.tiers))
        return t

    def _put(self, tier: str, keys: list[ObjectKey], payloads: Mapping[ObjectKey, torch.Tensor],
             metas: Mapping[ObjectKey, ObjectMeta]) -> list[bool]:
        t = self._tier(tier)
        items = [(k, p) for k in keys if (p := payloads.get(k, self._stash.get(k))) is not None]
        if t is None or len(items) != len(keys):
            out = [False] * len(keys)
        else:
            ms = [metas.get(k) if k in payloads else self._stash_meta.get(k) for k in keys]
            try:
                out = list(_put_with(t, items, ms))
            except Exception:
                log.exception("put to tier %s failed", tier)
                t.remove(keys)
                out = [False] * len(keys)
        for k, ok in zip(keys, out, strict=True):  # a taken object leaves the stash once stored
            if self._stash.pop(k, None) is not None:
                self._relocations += 1
            self._stash_meta.pop(k, None)
            src = self._taken_from.pop(k, None)
            if ok and src is not None:
                self._count(k, src, tier)
        return out

    def _count(self, key: ObjectKey, src: str, dst: str) -> None:
        up = self._rank.get(dst, 0) < self._rank.get(src, 0)
        (self.promotions if up else self.demotions)[key.kind.value] += 1

    def _move(self, op: Move) -> bool:
        src, dst = self._tier(op.src), self._tier(op.dst)
        if src is None or dst is None:
            return False
        ok = False
        try:
            meta = src.object_meta(op.key)
            data = src.get([op.key])[0]
            ok = data is not None and bool(_put_with(dst, [(op.key, data)], [meta])[0])
        except Exception:
            log.exception("move %s -> %s failed", op.src, op.dst)
        self._relocations += 1
        if op.src != self.shared:
            src.remove([op.key])  # moved, or failed: either way no stale copy stays behind
        if not ok and op.dst != self.shared:
            dst.remove([op.key])
        if ok:
            self._count(op.key, op.src, op.dst)
        return ok

    def _take(self, op: Take) -> bool:
        t = self._tier(op.tier)
        if t is None:
            return False
        try:
            meta = t.object_meta(op.key)
            data = t.get([op.key])[0]
        except Exception:
            log.exception("take from tier %s failed", op.tier)
            data = None
        if data is not None:
            if meta is not None:
                self._stash_meta[op.key] = meta
            self._stash[op.key] = data  # before the remove: a concurrent read always finds it
            self._relocations += 1
            self._taken_from[op.key] = op.tier
        if op.tier != self.shared:
            t.remove([op.key])  # the stash holds it until its put
        return data is not None

    def _record(self, op: Record) -> bool:
        t = self._tier(op.tier)
        append = getattr(t, "append_record", None)
        if append is None:
            return False
        try:
            return bool(append(op.name, op.data))
        except Exception:
            log.exception("manifest append on tier %s failed", op.tier)
            return False

    def _remove(self, op: Remove) -> bool:
        t = self._tier(op.tier)
        if t is None or op.tier == self.shared:
            return op.tier == self.shared  # shared copies are never deleted: nothing to do
        try:
            t.remove([op.key])
            return not t.contains([op.key])[0]
        except Exception:
            log.exception("remove from tier %s failed", op.tier)
            return False

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every op submitted so far has run."""
        for lane in self._lanes.values():
            lane.submit(lambda: None).result(timeout)

    # ------------------------------------------------------------------ reads
    def read(self, keys: Sequence[ObjectKey], hints: Sequence[str | None] | None = None
             ) -> list[torch.Tensor | None]:
        """Each key's payload from the hinted tier, else from any tier holding it (None
        when no tier has a good copy). Tensors belong to the caller."""
        hints = list(hints) if hints is not None else [None] * len(keys)
        return [self._read_one(k, h) for k, h in zip(keys, hints, strict=True)]

    def _read_one(self, key: ObjectKey, hint: str | None) -> torch.Tensor | None:
        # A move can carry the object from a place not looked at yet to one already looked
        # at (a take into the stash, a move to a tier earlier in the order): a miss while a
        # move landed somewhere looks again (a few times: a lane cannot move it forever).
        for _ in range(4):
            seen = self._relocations
            data = self._read_scan(key, hint)
            if data is not None or self._relocations == seen:
                return data
        return None

    def _read_scan(self, key: ObjectKey, hint: str | None) -> torch.Tensor | None:
        staged = self._stash.get(key)  # mid-promotion: taken, not put back yet
        if staged is not None:
            return staged.to(self.device, copy=True)
        order = [hint] if hint in self.tiers else []
        order += [n for n in self.tiers if n != hint]
        for name in order:
            t = self.tiers[name]
            try:
                if not t.contains([key])[0]:
                    continue
                data = t.get([key], device=self.device)[0]
            except Exception:
                log.exception("read from tier %s failed", name)
                data = None
            if data is not None:
                return data
        return None

    def holder(self, key: ObjectKey) -> str | None:
        """Name of a tier holding ``key`` (fastest first), or None. After a failed read, a
        key still held was only unavailable (a remote that is down); one no tier holds any
        more was lost (missing or corrupt: the tier forgot it)."""
        if key in self._stash:
            return "stash"
        return next((n for n, t in self.tiers.items() if t.contains([key])[0]), None)

    def close(self) -> None:
        """Finish the queued ops, then close every tier."""
        for lane in self._lanes.values():
            lane.shutdown(wait=True)
        for t in self.tiers.values():
            t.close()


def _put_with(t: Tier, items: list[tuple[ObjectKey, torch.Tensor]],
              metas: list[ObjectMeta | None]) -> list[bool]:
    """``t.put(items, metas)``; without any metadata the plain ``t.put(items)``, so a tier
    written before ``put`` took metadata keeps working."""
    return t.put(items, metas) if any(m is not None for m in metas) else t.put(items)
