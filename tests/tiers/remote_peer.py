"""Another cache instance in another process, for the shared remote tier tests.

``Peer`` starts one ``multiprocessing`` *spawn* child (a fresh interpreter: nothing is
inherited but arguments) that runs ``serve``: it takes ``(function name, args)`` over a
pipe, runs that function of this module with a fresh ``RemoteTier`` per call and sends
back ``("ok", result)`` or ``("err", repr)``. Results are plain data (bools, ints, bytes),
never tensors: the child checks bit identity itself against payloads it regenerates.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing.connection import Connection
from typing import Any

import torch
from tier_helpers import DTYPES, make_key, make_payload, same_bits

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.tiers.remote.tier import RemoteTier

BIG = {k: 1 << 26 for k in ObjectKind}
SHAPES = [(3, 5), (), (0,), (2, 3, 4)]


def items(fp: str) -> list[tuple[ObjectKey, torch.Tensor]]:
    """Every dtype (bfloat16 included) at every shape (0-d and empty too), all kinds."""
    kinds = list(ObjectKind)
    return [(make_key(i, kinds[i % len(kinds)], fp=fp), make_payload(i, shape, dt))
            for i, (dt, shape) in enumerate((d, s) for d in DTYPES for s in SHAPES)]


def put_objects(url: str, fp: str, serde: str, remove_after: bool) -> list[bool]:
    """Put ``items(fp)``; with ``remove_after`` remove them all again (which must only
    forget them here). The puts' results, then the removes'."""
    tier = RemoteTier(url, BIG, serde=serde, timeout=5)
    its = items(fp)
    out = list(tier.put(its))
    if remove_after:
        keys = [k for k, _ in its]
        out += tier.remove(keys)
    tier.close()
    return out


def read_objects(url: str, fp: str) -> list[bool]:
    """A tier that never put ``items(fp)``: whether each is contained and reads back bit
    identical through ``get`` and ``get_into``."""
    tier = RemoteTier(url, BIG, timeout=5)
    its = items(fp)
    keys = [k for k, _ in its]
    found = tier.contains(keys)
    got = tier.get(keys)
    outs = [torch.empty_like(v) for _, v in its]
    into = tier.get_into(keys, outs)
    tier.close()
    return [f and same_bits(g, v) and i and same_bits(o, v)
            for f, g, i, o, (_, v) in zip(found, got, into, outs, its, strict=True)]


def append_records(url: str, name: str, tag: bytes, n: int, other: bytes = b"") -> list[bool]:
    """Append ``tag + i`` for i < n to manifest ``name``. With ``other``, stop halfway
    until a record starting with ``other`` is listed (up to 10 s): two writers doing this
    are then both mid-sequence at once, so their appends truly overlap."""
    tier = RemoteTier(url, BIG, timeout=5)
    out = []
    for i in range(n):
        if other and i == n // 2:
            give_up = time.monotonic() + 10
            while (not any(r.startswith(other) for r in tier.records(name))
                   and time.monotonic() < give_up):
                time.sleep(0.001)
        out.append(tier.append_record(name, tag + b"%d" % i))
    tier.close()
    return out


def list_records(url: str, name: str) -> list[bytes]:
    tier = RemoteTier(url, BIG, timeout=5)
    out = tier.records(name)
    tier.close()
    return out


def serve(conn: Connection) -> None:
    while (msg := conn.recv()) is not None:
        fn, args = msg
        try:
            conn.send(("ok", globals()[fn](*args)))
        except Exception as exc:  # report, keep serving
            conn.send(("err", repr(exc)))


class Peer:
    """The child instance; ``call`` runs a function there and waits, ``start``/``result``
    let the parent work meanwhile."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def start(self, fn: str, *args: Any) -> None:
        self.conn.send((fn, args))

    def result(self, timeout: float = 60) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError("peer process did not answer")
        status, out = self.conn.recv()
        if status != "ok":
            raise AssertionError(f"peer failed: {out}")
        return out

    def call(self, fn: str, *args: Any) -> Any:
        self.start(fn, *args)
        return self.result()

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
