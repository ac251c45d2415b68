"""The other instance for tests/tiers/test_cross_instance.py: a process with its own cache
(host tier + the shared remote) that serves a few requests and exits.

Payloads are a deterministic function of (prefix tokens, kind, start), so the instance in
the test process can check byte for byte that what it loads was made for its prefix."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import torch

from hybrid_connector import assemble
from hybrid_connector.core.config import load_config
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.runtime.session import RequestSession

GEO = ModelGeometry.from_dict({
    "name": "tiny-x", "architecture": "qwen3_5_text", "hidden_size": 8, "vocab_size": 64,
    "layers": ["gdn+mlp", "attention+mlp"],
    "attention": {"num_heads": 1, "num_kv_heads": 1, "head_dim": 4},
    "gdn": {"num_k_heads": 1, "num_v_heads": 1, "head_k_dim": 2, "head_v_dim": 2,
            "conv_kernel": 2},
    "mlp": {"intermediate_size": 16},
})


def config(url: str):  # type: ignore[no-untyped-def]
    return load_config(overrides={
        "chunk_size": 8, "hash_block_size": 4, "alignment": 4, "remote_url": url,
        "remote_timeout_s": 5.0,
        "pools": {"host": {"kv": 4096, "state": 512}, "remote": {"kv": 10**6, "state": 10**5}},
    }, environ={})


def payload(tokens: np.ndarray, kind: ObjectKind, start: int, end: int) -> torch.Tensor:
    n = (end - start) * GEO.kv_bytes_per_token() if kind is ObjectKind.KV else GEO.state_bytes()
    seed = hashlib.blake2b(np.asarray(tokens[:end], dtype=np.int64).tobytes()
                           + f"{kind.value}{start}".encode(), digest_size=8).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(seed, "little") >> 1)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)


def serve(cache, prompt: np.ndarray) -> int:  # type: ignore[no-untyped-def]
    """One request through a session (checked loads, geometry-sized payloads); its hit."""
    s = RequestSession(cache, prompt)
    loaded = s.load()
    for obj, t in zip(s.plan.kv, loaded.kv, strict=True):
        if obj.ref.end <= s.plan.matched_tokens:
            assert torch.equal(t, payload(prompt, ObjectKind.KV, obj.ref.start, obj.ref.end))
    if loaded.num_tokens:
        assert torch.equal(loaded.state, payload(prompt, ObjectKind.STATE, s.hit, s.hit))
    s.release()
    s.save_prefill(lambda a, b: payload(prompt, ObjectKind.KV, a, b),
                   {q: payload(prompt, ObjectKind.STATE, q, q) for q in s.checkpoints})
    end = cache.final_checkpoint(len(prompt))
    s.finish(lambda a, b: payload(prompt, ObjectKind.KV, a, b),
             {end: payload(prompt, ObjectKind.STATE, end, end)})
    return s.hit


def prompts(seed: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 60, 40)
    return [np.r_[base, rng.integers(60, 64, 6)], np.r_[base[:24], rng.integers(60, 64, 9)]]


def main(url: str, out: str) -> None:
    cache = assemble.cache(config(url), GEO)
    for p in prompts():
        serve(cache, p)
    cache.flush()  # every put and record on the remote has landed
    cache.close()
    Path(out).write_text("done")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
