"""A tensor-parallel worker process for tests/core/test_tp_processes.py: one rank's tiers
(host + NVMe in its own directory) behind a ``RankWorker``, driven over a pipe.

Payloads are deterministic per (rank, token prefix, kind, start), so every load can be
checked byte for byte: a shard made for another rank or another prefix is caught."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import numpy as np
import torch

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.runtime.ranks import RankWorker
from hybrid_connector.tiers.executor import Executor
from hybrid_connector.tiers.host import HostTier
from hybrid_connector.tiers.nvme import NvmeTier


def shard(rank: int, tokens: np.ndarray, kind: ObjectKind, start: int, end: int,
          nbytes: int) -> torch.Tensor:
    """What rank ``rank`` computes for an object of ``tokens[:end]``. KV bytes of position i
    depend only on ``tokens[:i + 1]`` (as real KV does), so a chunk running past a branch
    point still proves its shared part."""
    toks = np.asarray(tokens, dtype=np.int64)
    if kind is ObjectKind.KV:
        per = nbytes // (end - start)
        parts = [hashlib.blake2b(toks[: i + 1].tobytes() + f"{rank}kv".encode(),
                                 digest_size=per).digest() for i in range(start, end)]
        return torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)
    seed = hashlib.blake2b(toks[:end].tobytes() + f"{rank}{kind.value}{start}".encode(),
                           digest_size=8).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(seed, "little") >> 1)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)


def made_for(rank: int, tokens: np.ndarray, key: ObjectKey, data: torch.Tensor,
             upto: int) -> bool:
    """``data`` is what ``rank`` made for ``key`` on a prefix agreeing with ``tokens`` on
    ``[0, upto)`` (KV: the positions below ``upto``; others: the whole object)."""
    if key.kind is not ObjectKind.KV:
        return torch.equal(data, shard(rank, tokens, key.kind, key.start, key.end, data.numel()))
    per = data.numel() // (key.end - key.start)
    hi = min(key.end, upto)
    want = shard(rank, tokens, key.kind, key.start, hi, per * (hi - key.start))
    return torch.equal(data[: want.numel()], want)


def main(rank: int, conn, root: str, host: dict, disk: dict) -> None:  # type: ignore[no-untyped-def]
    kinds = {ObjectKind(k): v for k, v in host.items()}
    nvme = NvmeTier(Path(root) / f"rank{rank}", {ObjectKind(k): v for k, v in disk.items()},
                    fsync=False)
    tiers = [HostTier(kinds), nvme]
    worker = RankWorker(rank, Executor(tiers))
    send_lock = threading.Lock()

    def send(msg: object) -> None:
        with send_lock:
            conn.send(msg)

    while True:
        msg = conn.recv()
        what = msg[0]
        if what == "ops":
            _, batch, tokens, makes = msg
            payloads = {key: shard(rank, tokens, key.kind, key.start, key.end, n)
                        for key, n in makes}
            worker.run(batch, payloads, lambda rep: send(("report", rep)))
        elif what == "load":
            _, plan_id, tokens, keys, tiers_, sizes, matched = msg
            got, rep = worker.load(plan_id, keys, tiers_, sizes)
            wrong = [k for k, t in zip(keys, got, strict=True)
                     if t is not None and not made_for(rank, tokens, k, t, matched)]
            send(("loaded", rep, wrong))
        elif what == "inventory":
            worker.executor.flush()
            held: dict[ObjectKey, str] = {}
            for t in tiers:
                for k in t.held_keys():
                    held[k] = t.name
            send(("inventory", held))
        elif what == "corrupt":
            key = msg[1]
            f = nvme.path / key.digest()
            if f.exists():                       # rot on disk: the read finds it corrupt
                raw = bytearray(f.read_bytes())
                raw[-1] ^= 0xFF
                f.write_bytes(bytes(raw))
            else:                                # lost from memory
                tiers[0].remove([key])
            send(("corrupted", key))
        elif what == "stop":
            worker.executor.close()
            send(("stopped",))
            return
