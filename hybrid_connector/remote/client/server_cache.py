"""``ServerCache``: ``CacheAPI`` (the embedded ``HybridCache``'s verbs) served by a cache
server.

An integration gets one from ``assemble.cache`` when the config has ``cache_server``; it
calls the same methods with the same contracts (see ``CacheAPI``), and the index, the
policies and the bytes live in the server, shared with every other engine of the model.
What differs, and why:

* A server that cannot be reached or does not answer within ``cache_server.timeout_s`` is a
  miss (``lookup``), a failed load (``load``: every object in ``failed``, hit 0), a
  rejected save (reason ``store``), never an exception and never a hang. The next call
  reconnects.
* ``stats`` counts this client's lookups (the server's ``STATS`` has every client's).
* Leases are the server's: ``acquire`` returns a ``Lease`` whose ``id`` is the server's;
  if this process dies, the server releases them when its last connection closes.
* ``save_async`` runs the upload on one ordered background thread (payloads must stay
  untouched until its future is done, as with the embedded cache); ``finish`` and
  ``flush`` wait for it first, so the server sees a request's saves in order.

Raises only at construction (the first ``HELLO``: a wrong URL should fail loudly):
``ServerUnavailable`` when the server cannot be reached, ``ServerRefused`` for a wrong
token, ``ValueError`` when it refuses the model; afterwards ``ValueError`` where the
embedded cache raises it (bad alignment, malformed items: the server's ``BAD_REQUEST``).
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import numpy as np
import torch

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.config_server import host_port
from hybrid_connector.core.hashes import Hashes
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.index.discovery import Found
from hybrid_connector.index.plan import MISS, LoadPlan, LoadResult, Rejection, SaveItem, SaveResult
from hybrid_connector.index.saving import object_nbytes
from hybrid_connector.index.state import CacheStats, Lease
from hybrid_connector.policies.base import SavePlan
from hybrid_connector.remote.client.connection import Connection, ServerRefused, ServerUnavailable
from hybrid_connector.remote.wire import convert as cv
from hybrid_connector.remote.wire import messages as m
from hybrid_connector.remote.wire.frames import Code, Ext, split_payloads
from hybrid_connector.runtime.api import CacheAPI

log = logging.getLogger(__name__)
T = TypeVar("T", bound=m.Msg)
POOL = 4  # idle connections kept per client


def _bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]


class ServerCache(CacheAPI):
    """See the module docstring; the verbs' contracts are ``CacheAPI``'s. Thread safe (a
    pool of connections)."""

    def __init__(self, config: HybridConfig, geometry: ModelGeometry,
                 layout: dict[str, object] | None = None, model_id: str = "") -> None:
        if config.cache_server is None:
            raise ValueError("ServerCache needs config.cache_server")
        self._config, self._geometry = config, geometry
        self.settings = config.cache_server
        self.host, self.port = host_port(self.settings.url)
        self.session = secrets.token_hex(16)
        self._hello = m.Hello(geometry.to_dict(), dict(layout or {}), model_id,
                              cv.client_cache_keys(config), self.session)
        self._idle: queue.LifoQueue[Connection] = queue.LifoQueue()
        self._saves = ThreadPoolExecutor(1, thread_name_prefix="hc-upload")
        self._io = ThreadPoolExecutor(2, thread_name_prefix="hc-load")
        self._leases: dict[LoadPlan, list[int]] = {}
        self._lock = threading.Lock()
        self.stats = CacheStats()
        conn = self._connect()
        self.fingerprint = self._fp
        self._idle.put(conn)

    # ---------------------------------------------------------------- views
    @property
    def config(self) -> HybridConfig:
        return self._config

    @property
    def geometry(self) -> ModelGeometry:
        return self._geometry

    def expected_nbytes(self, kind: ObjectKind, start: int, end: int) -> int:
        """Payload bytes the geometry gives an object (as ``HybridCache.expected_nbytes``)."""
        return object_nbytes(self._geometry, self._config, kind, start, end)

    # ---------------------------------------------------------------- transport
    def _connect(self) -> Connection:
        conn = Connection(self.host, self.port, self.settings.timeout_s, self.settings.token)
        try:
            reply, _ = conn.expect(Ext.HELLO, self._hello, m.HelloReply)
        except ServerRefused as exc:
            conn.close()
            raise ValueError(f"cache server at {self.settings.url} refused this model: "
                             f"{exc}") from None
        self._fp = reply.fingerprint  # type: ignore[attr-defined]
        return conn

    @contextmanager
    def _conn(self, pooled: bool = True) -> Iterator[tuple[Connection, bool]]:
        """A connection and whether it came from the idle pool."""
        conn = None
        if pooled:
            with suppress(queue.Empty):
                conn = self._idle.get_nowait()
        reused = conn is not None
        if conn is None:
            conn = self._connect()
        try:
            yield conn, reused
        finally:
            if not conn.closed and self._idle.qsize() < POOL:
                self._idle.put(conn)
            elif not conn.closed:
                conn.close()

    def _ask(self, command: Ext, msg: m.Msg, reply_type: type[T],
             payloads: Sequence[bytes | memoryview] = ()) -> tuple[T, memoryview]:
        """One call; ``ServerUnavailable`` when it cannot complete, ``ValueError`` for a
        ``BAD_REQUEST`` (the embedded cache's ValueError), ``ServerRefused`` otherwise.
        A call that fails on an idle pooled connection (the server restarted since) is
        tried once more on a fresh one."""
        for pooled in (True, False):
            with self._conn(pooled) as (conn, reused):
                try:
                    reply, rest = conn.expect(command, msg, reply_type, payloads)
                except ServerRefused as exc:
                    if exc.code == Code.BAD_REQUEST:
                        raise ValueError(str(exc)) from None
                    raise
                except ServerUnavailable:
                    if not reused:
                        raise
                    continue
            return reply, rest  # type: ignore[return-value]
        raise AssertionError("unreachable")

    def _try(self, command: Ext, msg: m.Msg, reply_type: type[T],
             payloads: Sequence[bytes | memoryview] = ()) -> tuple[T, memoryview] | None:
        try:
            return self._ask(command, msg, reply_type, payloads)
        except (ServerUnavailable, ServerRefused) as exc:
            log.warning("cache server %s: %s failed: %s", self.settings.url, command.name, exc)
            return None

    # ---------------------------------------------------------------- lookups
    def lookup(self, tokens: Sequence[int] | np.ndarray, alignment: int | None = None,
               replay: bool | None = None) -> LoadPlan:
        got = self._try(Ext.LOOKUP, m.Lookup(cv.tokens_bytes(tokens), alignment, replay), m.Plan)
        return MISS if got is None else cv.plan_of(got[0], self.fingerprint)

    def lookup_at(self, tokens: Sequence[int] | np.ndarray, p: int,
                  alignment: int | None = None) -> LoadPlan:
        got = self._try(Ext.LOOKUP, m.Lookup(cv.tokens_bytes(tokens), alignment, None, p), m.Plan)
        return MISS if got is None else cv.plan_of(got[0], self.fingerprint)

    def discover(self, tokens: Sequence[int] | np.ndarray, hashes: Hashes | None = None,
                 alignment: int | None = None) -> Found:
        got = self._try(Ext.DISCOVER, m.Discover(cv.tokens_bytes(tokens), alignment), m.FoundReply)
        return Found() if got is None else cv.found(got[0])

    def record_lookup(self, plan: LoadPlan) -> None:
        with self._lock:
            s = self.stats
            s.lookups += 1
            s.prompt_tokens += plan.prompt_tokens
            if plan.hit:
                s.hits, s.hit_tokens = s.hits + 1, s.hit_tokens + plan.num_tokens
                s.approx_hits += not plan.exact
        self._try(Ext.RECORD_LOOKUP, m.PlanMsg(cv.plan_msg(plan)), m.Empty)

    def plan_saves(self, tokens: Sequence[int] | np.ndarray,
                   alignment: int | None = None) -> SavePlan:
        got = self._try(Ext.PLAN_SAVES, m.PlanSaves(cv.tokens_bytes(tokens), alignment),
                        m.SavePlanReply)
        return SavePlan((), None, 0) if got is None else cv.save_plan(got[0])

    def final_checkpoint(self, num_tokens: int, alignment: int | None = None) -> int:
        got = self._try(Ext.FINAL_CHECKPOINT, m.FinalCheckpoint(num_tokens, alignment), m.IntReply)
        return 0 if got is None else got[0].value

    # ---------------------------------------------------------------- leases
    def acquire(self, plan: LoadPlan) -> Lease | None:
        if not plan.hit:
            return None
        got = self._try(Ext.ACQUIRE, m.PlanMsg(cv.plan_msg(plan)), m.LeaseReply)
        if got is None or got[0].lease is None:
            return None
        lid = got[0].lease
        with self._lock:
            self._leases.setdefault(plan, []).append(lid)
        return Lease(lid, (), 0, (), tuple(o.ref.key for o in plan.objects))

    def release(self, lease: Lease | None) -> None:
        if lease is None:
            return
        with self._lock:
            for plan, ids in list(self._leases.items()):
                if lease.id in ids:
                    ids.remove(lease.id)
                    if not ids:
                        del self._leases[plan]
        self._try(Ext.RELEASE, m.Release(lease.id), m.Empty)

    # ---------------------------------------------------------------- loads
    def load(self, plan: LoadPlan) -> LoadResult:
        """See ``HybridCache.load``; a plan not ``acquire``-d is locked for the read."""
        if not plan.hit:
            return LoadResult(0, True)
        with self._lock:
            ids = list(self._leases.get(plan, ()))
        own = None if ids else self.acquire(plan)
        lid = ids[0] if ids else (own.id if own is not None else None)
        try:
            got = None if lid is None else self._try(Ext.LOAD, m.Load(cv.plan_msg(plan), lid),
                                                     m.LoadReply)
        finally:
            self.release(own)
        if got is None:
            return LoadResult(0, True, failed=tuple(o.ref for o in plan.objects))
        r, rest = got
        sizes = [*r.kv_sizes, *([r.state_size] if r.state_size is not None else []),
                 *r.anchor_sizes]
        views = split_payloads(rest, sizes) if sizes else []
        tensors = [torch.frombuffer(v, dtype=torch.uint8) for v in views]
        n_kv = len(r.kv_sizes)
        state = tensors[n_kv] if r.state_size is not None else None
        failed = tuple(o.ref for o in plan.objects if o.ref.key.to_str() in
                       {f.key for f in r.failed})
        return LoadResult(r.num_tokens, r.exact, tuple(tensors[:n_kv]), state,
                          tuple(tensors[n_kv + (state is not None):]), failed, r.kv_tokens)

    def load_async(self, plan: LoadPlan) -> Future[LoadResult]:
        return self._io.submit(self.load, plan)

    # ---------------------------------------------------------------- saves
    def _upload(self, tokens: Sequence[int] | np.ndarray, items: list[SaveItem],
                start: tuple[int, int] | None, finish: bool = False,
                prompt_len: int | None = None) -> SaveResult:
        views = [_bytes(it.payload) for it in items]
        msg = m.Save(cv.tokens_bytes(tokens),
                     [m.Item(it.kind.value, it.start, it.end, len(v)) for it, v in
                      zip(items, views, strict=True)], start, finish, prompt_len)
        got = self._try(Ext.SAVE, msg, m.SaveReply, views)
        if got is None:
            return SaveResult(0, 0, len(items), rejections=tuple(
                Rejection(it.kind, it.start, it.end, "store") for it in items))
        return cv.save_result(got[0])

    def save_async(self, tokens: Sequence[int] | np.ndarray, items: Iterable[SaveItem],
                   hashes: Hashes | None = None, start: tuple[int, int] | None = None
                   ) -> Future[SaveResult]:
        todo = list(items)
        return self._saves.submit(self._upload, np.asarray(tokens).copy(), todo, start)

    def save(self, tokens: Sequence[int] | np.ndarray, items: Iterable[SaveItem],
             hashes: Hashes | None = None, start: tuple[int, int] | None = None) -> SaveResult:
        return self.save_async(tokens, items, hashes, start).result()

    def finish(self, tokens: Sequence[int] | np.ndarray, items: Iterable[SaveItem] = (),
               prompt_len: int | None = None, hashes: Hashes | None = None,
               start: tuple[int, int] | None = None) -> SaveResult:
        if prompt_len is not None and not 0 <= prompt_len <= len(tokens):
            raise ValueError(f"prompt_len {prompt_len} outside [0, {len(tokens)}]")
        fut = self._saves.submit(self._upload, np.asarray(tokens).copy(), list(items), start,
                                 True, prompt_len)
        return fut.result()

    # ---------------------------------------------------------------- upkeep
    def flush(self) -> None:
        """Wait for this client's uploads, then for the server's queued tier ops."""
        self._saves.submit(lambda: None).result()
        self._try(Ext.FLUSH, m.Empty(), m.Empty)

    def check_integrity(self) -> None:
        """``flush``, then the server checks this model's index and its store's accounting
        (``HybridCache.check_integrity``); ``ServerRefused`` when that fails,
        ``ServerUnavailable`` when the server cannot be asked."""
        self._saves.submit(lambda: None).result()
        self._ask(Ext.FLUSH, m.Empty(), m.Empty)

    def server_stats(self) -> dict[str, Any] | None:
        """The server's ``STATS`` (every client's view), None when unreachable."""
        got = self._try(Ext.STATS, m.Empty(), m.StatsReply)
        return None if got is None else {f: getattr(got[0], f) for f in got[0].__struct_fields__}

    def close(self) -> None:
        """Wait for uploads and loads, then close every connection (the server releases
        this session's leases when the last one closes)."""
        self._saves.shutdown(wait=True)
        self._io.shutdown(wait=True)
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                break
