"""The remote tier on a sharded Redis Cluster or Valkey Cluster: ``redis+cluster://host:port
[,host:port...]`` (also ``rediss+``, ``valkey+``, ``valkeys+``; see
``hybrid_connector.core.remote_url``), through redis-py's cluster client; and ``make_client``,
which picks the client of any remote URL.

Objects spread over the cluster's 16384 hash slots by their digest: an object's name is
``hc:{digest}``, its hash tag the digest, so the chunks of a large object (see
``hybrid_connector.tiers.remote.chunks``: values over ``chunk_size`` bytes, 4 MiB by default) share its slot
and shard while different objects spread evenly. Manifests are lists, as on one server.

redis-py's ``RedisCluster`` discovers the cluster (``CLUSTER SLOTS`` of any reachable
startup node), keeps the slot map and one connection pool per node; this client sends each
command to its slot's master itself, on that node's pool, so that nothing of redis-py's
retry loop (its sleeps, its implicit topology refreshes behind locks) runs inside a call:

* Every method is one call under one deadline of ``timeout`` seconds (``hybrid_connector.tiers.deadline``:
  every connect, send and receive of every command of the call shares it), as on one
  server. A chunked put or read is several commands under that one deadline.
* A ``MOVED`` redirect patches the slot map and is followed, an ``ASK`` is followed with
  ``ASKING``, each at most twice per command and within the deadline.
* A shard that cannot be reached (refused, reset, timed out) is backed off for
  ``min_backoff`` doubling to ``max_backoff`` seconds: commands for its slots raise
  ``ShardUnavailable`` at once meanwhile, without the network. Every shard error asks for
  a topology refresh (at most one per ``refresh_interval``, by one thread, never waited
  for), and a command for a backed-off shard refreshes too: once a replica is promoted,
  its slots are found on it within about ``refresh_interval``. One WARNING per shard going
  down, one INFO when it is back. Refreshes run on a thread of their own, and a batch
  over several shards (``exists_many``) asks them side by side, each under what is left
  of the call's deadline: a hung shard costs its own keys, not the others' (see
  ``hybrid_connector.tiers.remote.shards``).
* ``ShardUnavailable`` is a ``RemoteError`` the tier counts as a miss without marking the
  whole remote down (the other shards keep answering). ``CLUSTERDOWN``, ``TRYAGAIN``,
  ``READONLY``, ``LOADING``, an uncovered slot: the same. A cluster that cannot be
  discovered at all (no node reachable, still forming) is a plain ``RemoteError``.

Nothing is ever deleted except the superseded chunks of a key put again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hybrid_connector.core.keys import ObjectKey
from hybrid_connector.core.remote_url import CLUSTER, parse_cluster_url, scheme_of
from hybrid_connector.tiers import deadline, manifest
from hybrid_connector.tiers.manifest import CorruptManifest, Limits
from hybrid_connector.tiers.remote import clients as remote_clients
from hybrid_connector.tiers.remote.chunks import MAX_CHUNK, MIN_CHUNK, decode_pointer, split
from hybrid_connector.tiers.remote.clients import (
    RemoteClient,
    RemoteError,
    ReplyTooLarge,
    ShardUnavailable,
    _DeadlineConnection,
)
from hybrid_connector.tiers.remote.shards import (
    Shards,
    answering_first,
    cluster_via,
    op,
    patch_slot,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
CHUNK_SIZE = 4 << 20
MAX_LEN = 1 << 36  # a client built without a tier: 64 GiB, one million MIN_CHUNK chunks
UNLINK_BATCH = 1024  # stale chunk names per UNLINK


class RedisClusterClient(RemoteClient):
    """See the module docstring. ``chunk_size``: the largest value one command moves
    (``MIN_CHUNK`` .. ``MAX_CHUNK``, else ValueError); ``max_len``: the largest blob this
    client puts (the remote tier passes its largest pool's blob bound), which bounds the
    previous version a put replaces."""

    def __init__(self, url: str, timeout: float, limits: Limits | None = None,
                 chunk_size: int = CHUNK_SIZE, min_backoff: float = 0.25,
                 max_backoff: float = 2.0, refresh_interval: float = 0.25,
                 max_len: int = MAX_LEN) -> None:
        import redis
        from redis import exceptions as rx

        if not MIN_CHUNK <= chunk_size <= MAX_CHUNK:
            raise ValueError(f"chunk_size {chunk_size}: expected {MIN_CHUNK}..{MAX_CHUNK} bytes")
        self.cfg = parse_cluster_url(url)
        self.url, self.timeout, self.chunk_size, self.max_len = url, timeout, chunk_size, max_len
        self.limits = limits or Limits()
        base = redis.SSLConnection if self.cfg.tls else redis.Connection
        self._conn_class = type("DeadlineConnection", (_DeadlineConnection, base), {})
        # Errors of one shard (it is down, failing over, loading, not serving the slot).
        self._shard_errors: tuple[type[Exception], ...] = (
            rx.ConnectionError, rx.TimeoutError, OSError, rx.ClusterError, rx.TryAgainError,
            rx.ReadOnlyError, rx.SlotNotCoveredError)
        self._rx = rx
        self._rc: Any = None
        self._init_lock = threading.Lock()
        self._shards = Shards(url, timeout, min_backoff, max_backoff, refresh_interval)

    def name_for(self, key: ObjectKey) -> str:
        return "hc:{" + key.digest() + "}"

    # ------------------------------------------------------------------ topology
    def _cluster(self) -> Any:
        """The cluster client, discovered on first use (within the call's deadline)."""
        rc = self._rc
        if rc is not None:
            return rc
        rem = deadline.left()
        if not self._init_lock.acquire(timeout=-1 if rem is None else rem):
            raise TimeoutError("remote call deadline passed")
        try:
            if self._rc is None:
                from redis.backoff import NoBackoff
                from redis.retry import Retry

                # Through a node that answers: a hung one (a stopped master) asked
                # first would spend the whole deadline (see cluster_via).
                self._rc = cluster_via(
                    answering_first(self.cfg.nodes, deadline.left() or self.timeout),
                    require_full_coverage=False, retry=Retry(NoBackoff(), 0), protocol=2,
                    socket_timeout=self.timeout, socket_connect_timeout=self.timeout,
                    connection_class=self._conn_class, username=self.cfg.username,
                    password=self.cfg.password)
            return self._rc
        finally:
            self._init_lock.release()

    def _node(self, rc: Any, name: str) -> Any:
        """The master serving ``name``'s slot; ShardUnavailable while it is backed off
        (after looking for a newer slot map) or when no node serves the slot."""
        try:
            node = rc.nodes_manager.get_node_from_slot(rc.keyslot(name))
            if self._shards.backing_off(node.name):
                self._shards.refresh(rc, avoid=node.name)  # a promoted replica may serve it by now
                node = rc.nodes_manager.get_node_from_slot(rc.keyslot(name))
        except self._rx.SlotNotCoveredError as exc:
            self._shards.refresh(rc)
            raise ShardUnavailable(f"slot of {name} not served: {exc}") from exc
        if self._shards.backing_off(node.name):
            raise ShardUnavailable(f"shard {node.name} is down (backing off)")
        return node

    def _cmd(self, name: str, fn: Callable[[Any], T], follow_ask: bool = True) -> T:
        """``fn(client)`` on the master of ``name``'s slot, following MOVED/ASK; shard
        failures raise ShardUnavailable (see the module docstring)."""
        rc = self._cluster()
        node = self._node(rc, name)
        asking = False
        for _ in range(3):
            try:
                deadline.left()  # spent (by an earlier command of this call): not this shard's fault
            except TimeoutError as exc:
                raise ShardUnavailable(f"{name}: the call's deadline passed") from exc
            try:
                r = rc.get_redis_connection(node)
                if asking:
                    p = r.pipeline(transaction=False)
                    p.execute_command("ASKING")
                    fn(p)
                    out: T = p.execute()[-1]
                else:
                    out = fn(r)
                self._shards.mark_up(node.name)
                return out
            except self._rx.MovedError as exc:  # the slot has a new master (failover, resharding)
                patch_slot(rc, exc)
                node, asking = self._node(rc, name), False
            except self._rx.AskError as exc:  # the slot is migrating; this key has moved
                target = rc.get_node(host=exc.host, port=exc.port)
                if target is None or not follow_ask:
                    raise ShardUnavailable(f"ASK redirect of {name} to {exc.host}:{exc.port}") from exc
                node, asking = target, True
            except (self._rx.ConnectionError, self._rx.TimeoutError, OSError) as exc:
                self._shards.mark_down(node.name, exc)
                self._shards.refresh(rc, force=True, avoid=node.name)
                raise ShardUnavailable(f"shard {node.name}: {type(exc).__name__}: {exc}") from exc
            except self._shard_errors as exc:  # CLUSTERDOWN, TRYAGAIN, READONLY, ...
                self._shards.refresh(rc)
                raise ShardUnavailable(f"shard {node.name}: {type(exc).__name__}: {exc}") from exc
        raise ShardUnavailable(f"{name}: too many redirects")

    def _call(self, fn: Callable[[], T], manifest_op: bool = False) -> T:
        try:
            with deadline.scope(self.timeout):
                return fn()
        except (RemoteError, CorruptManifest):
            raise
        except self._rx.ResponseError as exc:  # e.g. WRONGTYPE: the data, not the cluster
            if manifest_op:
                raise CorruptManifest(f"{type(exc).__name__}: {exc}") from exc
            raise RemoteError(f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # redis-py can raise anything at an odd server
            raise RemoteError(f"{type(exc).__name__}: {exc}") from exc

    # ------------------------------------------------------------------ objects
    def put(self, name: str, blob: bytes) -> None:
        self._call(lambda: self._put(name, blob))

    def _put(self, name: str, blob: bytes) -> None:
        if len(blob) <= self.chunk_size:
            if self._cmd(name, lambda r: r.set(name, blob)) is not True:
                raise RemoteError("SET was not acknowledged")
            return
        ptr, pieces = split(blob, self.chunk_size)
        for cname, piece in zip(ptr.chunk_names(name), pieces, strict=True):
            if self._cmd(cname, op("set", cname, piece)) is not True:
                raise RemoteError("SET of a chunk was not acknowledged")
        old = self._cmd(name, lambda r: r.set(name, ptr.encode(), get=True))
        prev = decode_pointer(old) if isinstance(old, bytes) else None
        if prev is None or prev.version == ptr.version:
            return
        if prev.total > self.max_len:  # no put of ours wrote it: corrupt, its chunks left
            log.warning("cluster %s: replaced a pointer claiming %d bytes in %d chunks (over "
                        "the bound %d); its chunks are not unlinked", name, prev.total,
                        prev.chunks, self.max_len)
            return
        stale = prev.chunk_names(name)  # lazy; readers still on them: misses
        for i in range(0, len(stale), UNLINK_BATCH):
            self._cmd(name, op("unlink", *stale[i:i + UNLINK_BATCH]))

    def get(self, name: str, max_len: int) -> bytes | bytearray | None:
        """A plain blob longer than ``max_len`` is cut at it (as on one server); a chunked
        one is refused (``ReplyTooLarge``) from its pointer, before anything is read."""
        return self._call(lambda: self._get(name, max_len, max_len))

    def _get(self, name: str, want: int, max_len: int) -> bytes | bytearray | None:
        """The first ``want`` bytes (``want <= max_len``) of the blob, None when absent."""
        v = self._cmd(name, lambda r: r.getrange(name, 0, want - 1))
        if not isinstance(v, bytes):
            raise RemoteError(f"GETRANGE answered a {type(v).__name__}")
        ptr = decode_pointer(v) if v else None
        if ptr is None:
            return v or None  # a plain blob (a missing key reads as empty)
        if ptr.total > max_len:  # checked before any chunk name or buffer exists
            raise ReplyTooLarge(f"{name}: pointer to {ptr.total} bytes in {ptr.chunks} chunks "
                                f"exceeds the bound {max_len}")
        want = min(ptr.total, want)
        names = ptr.chunk_names(name)  # lazy: only the ones read below are made
        out: bytearray | None = None
        for i, off in enumerate(range(0, want, ptr.chunk_size)):
            n = min(ptr.chunk_size, want - off)
            piece = self._cmd(names[i], op("getrange", names[i], 0, n - 1))
            if not isinstance(piece, bytes):
                raise RemoteError(f"GETRANGE answered a {type(piece).__name__}")
            if len(piece) != n:
                return None  # a chunk is gone (superseded, evicted): the object is not there
            if out is None:  # allocated once a chunk exists: a bare pointer costs nothing
                out = bytearray(want)
            out[off:off + n] = piece
        return out

    def read_head(self, name: str, head_len: int, max_len: int) -> bytes | bytearray | None:
        """The first ``head_len`` bytes; an object over ``max_len`` as ``get``."""
        return self._call(lambda: self._get(name, min(head_len, max_len), max_len))

    def exists(self, name: str) -> bool:
        return self.exists_many([name])[0]

    def exists_many(self, names: Sequence[str]) -> list[bool]:
        """One pipeline per shard; a shard that fails answers False for its names
        (ShardUnavailable only when every shard asked failed)."""
        return self._call(lambda: self._exists_many(names)) if names else []

    def _exists_many(self, names: Sequence[str]) -> list[bool]:
        rc = self._cluster()
        out = [False] * len(names)
        groups: dict[str, list[int]] = {}  # node name -> indices of its names
        failed: list[Exception] = []
        for i, n in enumerate(names):
            try:
                node = self._node(rc, n)
            except ShardUnavailable as exc:
                failed.append(exc)
                continue
            groups.setdefault(node.name, []).append(i)
        errors = [e for e in self._shards.each(
            list(groups.values()), lambda idx: self._exists_on(rc, names, idx, out)) if e]
        for e in errors:
            if not isinstance(e, ShardUnavailable):
                raise e
        if (failed or errors) and len(errors) == len(groups):
            raise (errors + failed)[0]  # no shard answered
        return list(out)  # a shard answering after the deadline writes to ``out`` no more

    def _exists_on(self, rc: Any, names: Sequence[str], idx: list[int], out: list[bool]) -> None:
        """One shard's EXISTS pipeline of ``names[i] for i in idx``, into ``out``."""
        def run(r: Any) -> list[Any]:
            p = r.pipeline(transaction=False)
            for i in idx:
                p.exists(names[i])
            return list(p.execute(raise_on_error=False))
        res = self._cmd(names[idx[0]], run, follow_ask=False)
        if len(res) != len(idx):
            raise RemoteError(f"EXISTS pipeline answered {str(res)[:80]}")
        for i, v in zip(idx, res, strict=True):
            if isinstance(v, self._rx.MovedError):
                patch_slot(rc, v)
            if isinstance(v, self._rx.AskError):  # or MOVED: asked alone, redirected
                with contextlib.suppress(ShardUnavailable):
                    v = self._cmd(names[i], op("exists", names[i]))
            if isinstance(v, Exception):
                continue
            if type(v) is not int:
                raise RemoteError(f"EXISTS pipeline answered {str(res)[:80]}")
            out[i] = v > 0

    def health(self) -> None:
        """PING every master side by side in one deadline; fine as soon as one answers (a
        hung master, asked first in turn, would have spent the whole deadline)."""
        def ping(rc: Any, node: Any) -> None:
            if rc.get_redis_connection(node).ping() is not True:
                raise RemoteError("PING was not answered with PONG")

        def run() -> None:
            rc = self._cluster()
            errors = self._shards.each(rc.get_primaries(), lambda n: ping(rc, n), until_one=True)
            if all(errors):
                raise RemoteError(f"no master answered PING: {[e for e in errors if e][:1]}")
        self._call(run)

    # ------------------------------------------------------------------ manifests
    def append_record(self, name: str, record: bytes) -> None:
        key, n = manifest.redis_key(name), self.limits.max_records

        def run(r: Any) -> list[Any]:
            p = r.pipeline(transaction=True)  # MULTI ... EXEC on the key's master: atomic
            p.rpush(key, record)
            p.ltrim(key, -n, -1)
            return list(p.execute())
        res = self._call(lambda: self._cmd(key, run, follow_ask=False), manifest_op=True)
        if len(res) != 2 or type(res[0]) is not int or res[0] < 1:
            raise RemoteError(f"RPUSH answered {str(res)[:80]}")

    def records(self, name: str) -> list[bytes]:
        key, n, most = manifest.redis_key(name), self.limits.max_records, self.limits.max_record_bytes
        v = self._call(lambda: self._cmd(key, lambda r: r.lrange(key, -n, -1)), manifest_op=True)
        if not isinstance(v, list):
            raise CorruptManifest(f"LRANGE answered a {type(v).__name__}")
        return [r for r in v[-n:] if isinstance(r, bytes) and len(r) <= most]

    def close(self) -> None:
        self._shards.close()
        if self._rc is not None:
            with contextlib.suppress(Exception):
                self._rc.close()


def make_client(url: str, timeout: float, limits: Limits | None = None,
                chunk_size: int = CHUNK_SIZE, max_len: int = MAX_LEN) -> RemoteClient:
    """Client of any remote URL: the cluster schemes here, the rest
    ``hybrid_connector.tiers.remote.clients.make_client``. ``chunk_size`` and ``max_len`` apply to cluster
    URLs (see ``RedisClusterClient``)."""
    if scheme_of(url) in CLUSTER:
        return RedisClusterClient(url, timeout, limits, chunk_size=chunk_size, max_len=max_len)
    return remote_clients.make_client(url, timeout, limits)

