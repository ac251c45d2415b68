"""The server's synchronous core: hybrid commands against the models' caches.

``Service.ext`` takes one decoded hybrid frame and returns its reply; it runs on the
server's worker threads (never on the event loop) and never raises: a malformed message
is ``BAD_REQUEST`` with the reason, a request the server cannot serve (an unknown lease,
a payload above ``max_object_bytes``) ``FAIL``/``TOO_LARGE``, a bug ``INTERNAL`` (logged).
Nothing a client sends can reach another model's objects (plans are checked against the
connection's fingerprint, loads against the session's own leases), and nothing it sends is
trusted about an object: a LOAD reads with the sizes and tiers the server recorded when the
lease was taken (a plan that disagrees is that client's error, ``FAIL``, and the objects are
untouched). Bounds on what one client can hold: models (``server.models``), leases (their
lifetime, per-session count and pinned bytes: ``server.sessions``); expired leases are
released before every command and by a background sweep.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import torch

from hybrid_connector.core.config import HybridConfig
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.index.plan import LoadPlan, PlannedObject, SaveItem
from hybrid_connector.remote.wire import convert as cv
from hybrid_connector.remote.wire import messages as m
from hybrid_connector.remote.wire.frames import Code, Ext, FrameError, split_payloads
from hybrid_connector.runtime.cache import HybridCache
from hybrid_connector.server.models import HelloError, Models, ModelsFull
from hybrid_connector.server.plain import PlainObjects
from hybrid_connector.server.sessions import Held, LeaseRefused, Sessions
from hybrid_connector.server.stats import server_stats
from hybrid_connector.tiers.store import ObjectStore

log = logging.getLogger(__name__)
VERSION = "hybrid-connector/1"

REQUEST_TYPES: dict[Ext, type[m.Msg]] = {
    Ext.AUTH: m.Auth, Ext.HELLO: m.Hello, Ext.LOOKUP: m.Lookup, Ext.DISCOVER: m.Discover,
    Ext.PLAN_SAVES: m.PlanSaves, Ext.FINAL_CHECKPOINT: m.FinalCheckpoint,
    Ext.RECORD_LOOKUP: m.PlanMsg, Ext.ACQUIRE: m.PlanMsg, Ext.RELEASE: m.Release,
    Ext.LOAD: m.Load, Ext.SAVE: m.Save, Ext.STATS: m.Empty, Ext.FLUSH: m.Empty,
}
_DECODERS = {c: msgspec.msgpack.Decoder(t) for c, t in REQUEST_TYPES.items()}
_ENCODER = msgspec.msgpack.Encoder()


@dataclass
class Reply:
    code: int
    message: bytes = b""
    payloads: list[memoryview] = field(default_factory=list)


@dataclass
class Conn:
    """One connection's state: authenticated yet, its session and model after HELLO."""

    authed: bool
    session: str | None = None
    cache: HybridCache | None = None
    pending: Any = None  # the event loop's task storing this connection's last plain PUT


def decode(command: Ext, message: bytes | memoryview) -> m.Msg:
    """The typed message of a hybrid frame; ``msgspec`` errors on any mismatch."""
    return _DECODERS[command].decode(message)


def ok(msg: m.Msg, payloads: list[memoryview] | None = None) -> Reply:
    return Reply(Code.OK, _ENCODER.encode(msg), payloads or [])


def error(code: int, why: str) -> Reply:
    return Reply(code, _ENCODER.encode(m.Error(why[:2000])))


def as_view(t: torch.Tensor) -> memoryview:
    return memoryview(t.contiguous().view(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]


class Service:
    """Models, plain objects and sessions over one store (see the module docstring)."""

    def __init__(self, config: HybridConfig, store: ObjectStore) -> None:
        self.config = config
        self.store = store
        self.models = Models(config, store)
        self.plain = PlainObjects(store)
        self.sessions = Sessions(config.server)
        self._stop = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep_loop, name="hc-lease-expiry",
                                         daemon=True)
        self._sweeper.start()

    # ------------------------------------------------------------------ dispatch
    def ext(self, conn: Conn, command: Ext, message: memoryview, payloads: memoryview) -> Reply:
        try:
            self.expire()
            msg = decode(command, message)
            if command is Ext.HELLO:
                return self._hello(conn, msg)  # type: ignore[arg-type]
            if command is Ext.STATS:
                return ok(m.StatsReply(**self.stats()))
            if conn.cache is None or conn.session is None:
                return error(Code.BAD_REQUEST, "HELLO first: this connection serves no model")
            return self._model(conn, conn.cache, conn.session, command, msg, payloads)
        except ModelsFull as exc:
            return error(Code.UNAVAILABLE, str(exc))
        except (msgspec.DecodeError, msgspec.ValidationError, FrameError, HelloError,
                ValueError) as exc:
            return error(Code.BAD_REQUEST, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a bug: the connection survives, the log says what
            log.exception("hybrid command %s failed", command.name)
            return error(Code.INTERNAL, f"{type(exc).__name__}: {exc}")

    def _hello(self, conn: Conn, h: m.Hello) -> Reply:
        if conn.session is not None and conn.session != h.session:
            return error(Code.BAD_REQUEST, "a connection belongs to one session")
        cache = self.models.hello(h.geometry, h.layout, h.model_id, h.cache)
        if conn.session is None:
            self.sessions.join(h.session)
            conn.session = h.session
        if conn.cache is not None:  # bound to another model before: one user less there
            self.models.release(conn.cache)
        conn.cache = cache
        return ok(m.HelloReply(cache.fingerprint, VERSION))

    def _model(self, conn: Conn, cache: HybridCache, sid: str, command: Ext, msg: Any,
               payloads: memoryview) -> Reply:
        fp = cache.fingerprint
        if command is Ext.LOOKUP:
            tokens = cv.tokens_of(msg.tokens)
            plan = (cache.lookup(tokens, msg.alignment, msg.replay) if msg.at is None
                    else cache.lookup_at(tokens, msg.at, msg.alignment))
            return ok(cv.plan_msg(plan))
        if command is Ext.DISCOVER:
            return ok(cv.found_reply(cache.discover(cv.tokens_of(msg.tokens), None,
                                                    msg.alignment)))
        if command is Ext.PLAN_SAVES:
            return ok(cv.save_plan_reply(cache.plan_saves(cv.tokens_of(msg.tokens),
                                                          msg.alignment)))
        if command is Ext.FINAL_CHECKPOINT:
            return ok(m.IntReply(cache.final_checkpoint(msg.num_tokens, msg.alignment)))
        if command is Ext.RECORD_LOOKUP:
            cache.record_lookup(cv.plan_of(msg.plan, fp))
            return ok(m.Empty())
        if command is Ext.ACQUIRE:
            try:
                return ok(m.LeaseReply(self.sessions.acquire(sid, cache,
                                                             cv.plan_of(msg.plan, fp))))
            except LeaseRefused as exc:
                return error(Code.FAIL, str(exc))
        if command is Ext.RELEASE:
            held = self.sessions.take(sid, msg.lease)
            if held is None:
                return error(Code.FAIL, f"lease {msg.lease} is not this session's "
                                        "(released, expired or never taken)")
            held.cache.release(held.lease)
            return ok(m.Empty())
        if command is Ext.LOAD:
            return self._load(cache, sid, msg)
        if command is Ext.SAVE:
            return self._save(cache, msg, payloads)
        if command is Ext.FLUSH:  # queued tier ops landed, then the index checks itself
            cache.flush()
            try:
                cache.check_integrity()
            except AssertionError as exc:
                log.error("integrity check of %s failed: %s", fp, exc)
                return error(Code.INTERNAL, f"integrity check failed: {exc}")
            return ok(m.Empty())
        return error(Code.BAD_REQUEST, f"{command.name} is not a model command")

    def _load(self, cache: HybridCache, sid: str, msg: m.Load) -> Reply:
        plan = cv.plan_of(msg.plan, cache.fingerprint)
        held = self.sessions.checkout(sid, msg.lease)
        if held is None:
            return error(Code.FAIL, "LOAD needs a live lease of this session covering the plan")
        try:
            if held.cache is not cache:
                return error(Code.FAIL, "LOAD needs a lease of this session's model")
            trusted = self._trusted(plan, held)
            if isinstance(trusted, str):
                return error(Code.FAIL, trusted)
            r = cache.load(trusted)
        finally:
            self.sessions.checkin(held)
        views = [as_view(t) for t in (*r.kv, *((r.state,) if r.state is not None else ()),
                                      *r.anchors)]
        reply = m.LoadReply(r.num_tokens, r.exact, [len(v) for v in views[:len(r.kv)]],
                            len(views[len(r.kv)]) if r.state is not None else None,
                            [len(v) for v in views[len(r.kv) + (r.state is not None):]],
                            [m.Obj(f.key.to_str(), f.nbytes, "") for f in r.failed],
                            r.kv_tokens)
        return ok(reply, views)

    @staticmethod
    def _trusted(plan: LoadPlan, held: Held) -> LoadPlan | str:
        """``plan`` with the objects the server recorded for the lease (sizes, tiers), or
        why it cannot be read: an object the lease does not cover, or a size that is not
        the server's (the client's error: its objects stay as they are)."""
        def own(o: PlannedObject) -> PlannedObject | str:
            mine = held.objects.get(o.ref.key)
            if mine is None:
                return f"the lease does not cover {o.ref.key.to_str()}"
            if mine.ref.nbytes != o.ref.nbytes:
                return (f"{o.ref.key.to_str()} is {mine.ref.nbytes} B, the plan says "
                        f"{o.ref.nbytes} B: send the server's plan back unchanged")
            return mine

        objs = [own(o) for o in plan.objects]
        bad = [x for x in objs if isinstance(x, str)]
        if bad:
            return bad[0]
        good: list[PlannedObject] = objs  # type: ignore[assignment]
        n_kv = len(plan.kv)
        return replace(plan, kv=tuple(good[:n_kv]),
                       state=good[n_kv] if plan.state is not None else None,
                       anchors=tuple(good[n_kv + (plan.state is not None):]))

    def _save(self, cache: HybridCache, msg: m.Save, payloads: memoryview) -> Reply:
        limit = self.config.server.max_object_bytes
        if any(it.nbytes > limit for it in msg.items):
            return error(Code.TOO_LARGE, f"an object above max_object_bytes ({limit} B)")
        blobs = split_payloads(payloads, [it.nbytes for it in msg.items]) if msg.items else []
        if not msg.items and len(payloads):
            raise FrameError("payload bytes without items")
        with warnings.catch_warnings():  # read-only frame buffers: the tiers copy them
            warnings.simplefilter("ignore", UserWarning)
            items = [SaveItem(ObjectKind(it.kind), it.start, it.end,
                              torch.frombuffer(b, dtype=torch.uint8))
                     for it, b in zip(msg.items, blobs, strict=True)]
        tokens = cv.tokens_of(msg.tokens)
        start = tuple(msg.start_leaf) if msg.start_leaf is not None else None
        if msg.finish:
            r = cache.finish(tokens, items, prompt_len=msg.prompt_len, start=start)  # type: ignore[arg-type]
        else:
            r = cache.save(tokens, items, start=start)  # type: ignore[arg-type]
        return ok(cv.save_reply(r))

    def stats(self) -> dict[str, Any]:
        """See ``server.stats.server_stats``."""
        return server_stats(self.store, self.models, self.plain, self.sessions)

    # ------------------------------------------------------------------ lifecycle
    def expire(self) -> None:
        """Release the leases past their lifetime (``Sessions.expired``)."""
        for held in self.sessions.expired():
            with contextlib.suppress(ValueError):  # released already through another path
                held.cache.release(held.lease)

    def _sweep_loop(self) -> None:
        """Expire leases while no command arrives (a few sweeps per lease lifetime)."""
        every = min(1.0, self.sessions.lifetime / 4)
        while not self._stop.wait(every):
            try:
                self.expire()
            except Exception:  # a bug: keep sweeping, the log says what
                log.exception("lease expiry failed")

    def disconnected(self, conn: Conn) -> None:
        """A connection closed: its session's leases go when it was the last one, then
        its model loses a user (``Models.release``)."""
        if conn.session is not None:
            for held in self.sessions.leave(conn.session):
                with contextlib.suppress(ValueError):  # released already through another path
                    held.cache.release(held.lease)
        if conn.cache is not None:
            cache, conn.cache = conn.cache, None
            self.models.release(cache)

    def close(self) -> None:
        """Stop the lease sweep, detach every model (waits for queued I/O), then close the
        store (the NVMe tier is consistent after it: every acknowledged put has landed)."""
        self._stop.set()
        self._sweeper.join()
        self.models.close()
        self.store.close()
