"""One client process of ``benchmarks/server_load.py`` (and ``tests/server/test_server_load.py``).

Run as ``python benchmarks/load_worker.py``; it prints ``ready`` and then reads one JSON
command per line on stdin and answers one JSON line on stdout:

* ``{"op": "plain", ...}``: for ``seconds``, LMCache ``lm://`` frames on one connection to
  ``host:port``: PUT/GET/EXIST by ``op_weights`` over this client's own keys (``slots`` per
  size class, by ``size_weights``; a PUT overwrites a slot). Every payload is
  self-checking: a 32-byte header (magic, client, class, slot, version, and the xxh3-128
  of the rest and that identity); a GET is verified against it and against the version
  this client put last, so a torn, stale or foreign object counts as ``corrupt``. A GET
  or EXIST miss of a slot put before is a ``miss`` (a budgeted server may have dropped it),
  a socket error or an unexpected reply an ``error``. With ``token``, the connection
  AUTHs first (our server with ``server.token`` set).
* ``{"op": "lookup", ...}``: hybrid LOOKUPs through ``ServerCache`` of the conversations
  ``server_load.populate`` saved, checking each hit against what was found then, every
  ``load_every``-th one followed by a LOAD whose payloads are verified (``conv_bytes``);
  ``token``: the server's token (``cache_server.token``).
* ``{"op": "quit"}``.

Only the standard library, numpy and xxhash are imported for plain clients (they start in
a fraction of a second); a lookup client imports the connector on its first command.
"""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import sys
import time
from typing import Any

import numpy as np
import xxhash

CLIENT = struct.Struct("iiiiiiiii150s")  # hybrid_connector.tiers.lm_protocol, repeated to stay light
SERVER = struct.Struct("iiiiiiiii")
PUT, GET, EXIST = 1, 2, 3
OK = 200
HEAD = struct.Struct("<4sIIIQ")  # magic, client, class, slot, version (then 16 B digest)
HEAD_BYTES = HEAD.size + 16
MAGIC = b"HCLD"
CLASSES = ("anchor", "kv", "state")


def lm_key(client: int, cls: int, slot: int) -> str:
    """A CacheEngineKey string lmcache_server parses (hash in canonical hex)."""
    return f"load-c{client}@1@0@{(client << 20) | (cls << 16) | slot | (1 << 40):x}@uint8"


def digest(ident: bytes, body: memoryview | bytes) -> bytes:
    h = xxhash.xxh3_128(ident)
    h.update(body)
    return h.digest()


class Plain:
    """The plain load of one client against one server for one phase."""

    def __init__(self, cmd: dict[str, Any], versions: dict[str, int]) -> None:
        self.cmd = cmd
        self.me = int(cmd["client"])
        self.sizes = [int(cmd["sizes"][c]) for c in CLASSES]
        self.slots = [int(cmd["slots"][c]) for c in CLASSES]
        self.versions = versions  # (class, slot) -> last version put, per server
        self.rng = random.Random(cmd["seed"])
        nprng = np.random.default_rng(cmd["seed"])
        # one random pool per class; a put sends a random window of it (no copy)
        self.pools = [memoryview(nprng.integers(0, 256, s + 4096, dtype=np.uint8).tobytes())
                      for s in self.sizes]
        self.buf = bytearray(max(self.sizes))
        self.sock = socket.create_connection((cmd["host"], cmd["port"]), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.out: dict[str, Any] = {"ops": {}, "bytes": {}, "lat": {}, "errors": 0,
                                    "corrupt": 0, "misses": {}, "error_samples": []}
        if cmd.get("token"):
            self.auth(str(cmd["token"]))

    def auth(self, token: str) -> None:
        """AUTH on this connection (our server with ``server.token`` set); ConnectionError
        unless it succeeds. The only hybrid frame a plain client sends."""
        import msgspec

        from hybrid_connector.remote.wire import messages as m
        from hybrid_connector.remote.wire.frames import Ext, body_length, pack_body, request

        msg = msgspec.msgpack.encode(m.Auth(token))
        self.sock.sendall(request(int(Ext.AUTH), body_length(msg)) + pack_body(msg))
        code, length = self._reply()
        self._recv_into(memoryview(bytearray(length)))
        if code != OK:
            raise ConnectionError(f"AUTH refused: code {code}")

    def _count(self, name: str, nbytes: int, dt: float) -> None:
        o = self.out
        o["ops"][name] = o["ops"].get(name, 0) + 1
        o["bytes"][name] = o["bytes"].get(name, 0) + nbytes
        o["lat"].setdefault(name, []).append(round(dt, 6))

    def _recv_into(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionError("server closed the connection")
            got += k

    def _reply(self) -> tuple[int, int]:
        head = bytearray(SERVER.size)
        self._recv_into(memoryview(head))
        code, length, *_ = SERVER.unpack(head)
        return code, length

    def put(self, cls: int, slot: int) -> None:
        key = (f"{cls}.{slot}")
        version = self.versions.get(key, 0) + 1
        n = self.sizes[cls]
        off = self.rng.randrange(4096)
        body = self.pools[cls][off : off + n - HEAD_BYTES]
        ident = HEAD.pack(MAGIC, self.me, cls, slot, version)
        head = ident + digest(ident, body)
        t0 = time.perf_counter()
        self.sock.sendall(CLIENT.pack(PUT, n, 4, 6, 0, n, 0, 0, 0,
                                      lm_key(self.me, cls, slot).encode().ljust(150)) + head)
        self.sock.sendall(body)
        self.versions[key] = version
        self._count(f"put:{CLASSES[cls]}", n, time.perf_counter() - t0)

    def get(self, cls: int, slot: int) -> None:
        key = f"{cls}.{slot}"
        t0 = time.perf_counter()
        self.sock.sendall(CLIENT.pack(GET, 0, 0, 0, 0, 0, 0, 0, 0,
                                      lm_key(self.me, cls, slot).encode().ljust(150)))
        code, length = self._reply()
        if code != OK:
            self._count(f"get:{CLASSES[cls]}", 0, time.perf_counter() - t0)
            self._miss("get")
            return
        if length > len(self.buf):
            raise ConnectionError(f"GET reply of {length} B, more than any object")
        view = memoryview(self.buf)[:length]
        self._recv_into(view)
        dt = time.perf_counter() - t0
        self._count(f"get:{CLASSES[cls]}", length, dt)
        ident = HEAD.pack(MAGIC, self.me, cls, slot, self.versions[key])
        if (length != self.sizes[cls] or bytes(view[: HEAD.size]) != ident
                or bytes(view[HEAD.size : HEAD_BYTES]) != digest(ident, view[HEAD_BYTES:])):
            self.out["corrupt"] += 1

    def exist(self, cls: int, slot: int) -> None:
        t0 = time.perf_counter()
        self.sock.sendall(CLIENT.pack(EXIST, 0, 0, 0, 0, 0, 0, 0, 0,
                                      lm_key(self.me, cls, slot).encode().ljust(150)))
        code, _ = self._reply()
        self._count("exist", 0, time.perf_counter() - t0)
        if code != OK:
            self._miss("exist")

    def _miss(self, what: str) -> None:
        self.out["misses"][what] = self.out["misses"].get(what, 0) + 1

    def run(self) -> dict[str, Any]:
        cmd, rng = self.cmd, self.rng
        ops = list(cmd["op_weights"])
        op_w = [cmd["op_weights"][o] for o in ops]
        cls_w = [cmd["size_weights"][c] for c in CLASSES]
        t_start = time.perf_counter()
        t_end = t_start + float(cmd["seconds"])
        while time.perf_counter() < t_end:
            cls = rng.choices(range(len(CLASSES)), cls_w)[0]
            slot = rng.randrange(self.slots[cls])
            op = rng.choices(ops, op_w)[0]
            if f"{cls}.{slot}" not in self.versions:
                op = "put"  # nothing there yet to read
            try:
                getattr(self, op)(cls, slot)
            except (OSError, ValueError, struct.error) as exc:
                self.out["errors"] += 1
                if len(self.out["error_samples"]) < 5:
                    self.out["error_samples"].append(f"{op}: {type(exc).__name__}: {exc}")
                break  # the connection is gone
        # PUT has no reply: an EXIST drains the server's queue for this connection, so
        # the phase's time includes the work its last puts caused
        try:
            if self.versions:
                cls, slot = map(int, next(iter(self.versions)).split("."))
                self.exist(cls, slot)
        except OSError as exc:
            self.out["errors"] += 1
            self.out["error_samples"].append(f"drain: {exc}")
        self.out["seconds"] = time.perf_counter() - t_start
        self.sock.close()
        return self.out


def conv_prompt(seed: int, length: int, extra: int = 0) -> np.ndarray:
    """The tokens of conversation ``seed``: ``length`` saved, ``extra`` of a next turn (a
    lookup of exactly what was saved leaves the engine no token to compute)."""
    return np.r_[np.random.default_rng(seed).integers(0, 1000, length),
                 np.random.default_rng(seed + 10**6).integers(0, 1000, extra)]


def conv_bytes(conv: int, kind: str, start: int, end: int, n: int) -> bytes:
    """The payload ``populate`` saves for an object: random bytes, the first 16 the
    xxh3-128 of its identity and the rest (so a load verifies without the original)."""
    rest = np.random.default_rng([conv, CLASSES.index(kind), start, end]).integers(
        0, 256, n - 16, dtype=np.uint8).tobytes()
    return digest(f"{conv}/{kind}/{start}/{end}".encode(), rest) + rest


def lookups(cmd: dict[str, Any], caches: dict[str, Any]) -> dict[str, Any]:
    from hybrid_connector.core.config import load_config
    from hybrid_connector.geometry.presets import get_preset
    from hybrid_connector.remote.client.server_cache import ServerCache

    url = cmd["url"]
    if url not in caches:
        server = {"url": url, **({"token": cmd["token"]} if cmd.get("token") else {})}
        cfg = load_config(overrides={"cache_server": server, **cmd["cache"]}, environ={})
        caches[url] = ServerCache(cfg, get_preset(cmd["preset"]))
    cache = caches[url]
    out: dict[str, Any] = {"ops": {}, "bytes": {}, "lat": {}, "errors": 0, "corrupt": 0,
                           "misses": {}, "error_samples": [], "short_hits": 0}
    rng = random.Random(cmd["seed"])
    convs = cmd["conversations"]
    t_start = time.perf_counter()
    i = 0
    while time.perf_counter() < t_start + float(cmd["seconds"]):
        c = rng.choice(convs)
        prompt = conv_prompt(c["seed"], c["len"], 64)
        t0 = time.perf_counter()
        plan = cache.lookup(prompt)
        out["lat"].setdefault("lookup", []).append(round(time.perf_counter() - t0, 6))
        out["ops"]["lookup"] = out["ops"].get("lookup", 0) + 1
        out["bytes"]["lookup"] = out["bytes"].get("lookup", 0) + 0
        out["hit_tokens"] = out.get("hit_tokens", 0) + plan.num_tokens
        out["expected_tokens"] = out.get("expected_tokens", 0) + c["expect"]
        if plan.num_tokens < c["expect"]:
            out["short_hits"] += 1  # dropped by the budget: a miss, not an error
        elif plan.num_tokens > c["expect"]:
            out["errors"] += 1
            out["error_samples"].append(f"hit {plan.num_tokens} > {c['expect']}")
        i += 1
        if plan.hit and i % int(cmd["load_every"]) == 0:
            t0 = time.perf_counter()
            r = cache.load(plan)
            objs = [(o.ref.key, t) for o, t in zip(plan.kv, r.kv, strict=False)]
            if plan.state is not None and r.state is not None:
                objs.append((plan.state.ref.key, r.state))
            nbytes = 0
            for key, t in objs:
                data = t.numpy().tobytes()
                nbytes += len(data)
                kind = key.kind.value
                ident = f"{c['seed']}/{kind}/{key.start}/{key.end}".encode()
                if digest(ident, data[16:]) != data[:16]:
                    out["corrupt"] += 1
            name = "load"
            out["lat"].setdefault(name, []).append(round(time.perf_counter() - t0, 6))
            out["ops"][name] = out["ops"].get(name, 0) + 1
            out["bytes"][name] = out["bytes"].get(name, 0) + nbytes
            if r.failed:
                out["misses"]["load"] = out["misses"].get("load", 0) + 1
    out["seconds"] = time.perf_counter() - t_start
    return out


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    versions: dict[str, dict[str, int]] = {}  # per server address
    caches: dict[str, Any] = {}
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        try:
            if cmd["op"] == "plain":
                where = f"{cmd['host']}:{cmd['port']}"
                out = Plain(cmd, versions.setdefault(where, {})).run()
            else:
                out = lookups(cmd, caches)
        except Exception as exc:  # a client that cannot start: one error, say why
            out = {"ops": {}, "bytes": {}, "lat": {}, "errors": 1, "corrupt": 0, "misses": {},
                   "error_samples": [f"{type(exc).__name__}: {exc}"], "seconds": 0.0}
        print(json.dumps(out), flush=True)
    for c in caches.values():
        c.close()


if __name__ == "__main__":
    main()
