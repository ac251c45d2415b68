"""Radix match vs vLLM-style block hashing of a 128K-token prompt.

Builds a tree holding 1,000 cached sequences (agentic-like: a few long shared documents,
many branches), then times ``RadixTree.match`` of a 128K-token prompt that shares a long
prefix with one of them, against hashing the same prompt into 16-token chained block
hashes the way vLLM does (sha256 over the pickled ``(parent_hash, block_tokens,
extra_keys)``, its default ``sha256`` prefix-caching hash). Prints both timings and their
ratio (below 1: the radix match is faster).

    python benchmarks/radix.py [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import statistics
import time

import numpy as np

from hybrid_connector.core.keys import chain_hashes
from hybrid_connector.tree.radix import RadixTree


def vllm_block_hashes(tokens: list[int], block: int = 16) -> list[bytes]:
    parent = b"\x00" * 32
    out = []
    for i in range(0, len(tokens) - block + 1, block):
        parent = hashlib.sha256(
            pickle.dumps((parent, tuple(tokens[i : i + block]), None), protocol=5)
        ).digest()
        out.append(parent)
    return out


def build_tree(rng: np.random.Generator, n_seqs: int, prompt_len: int) -> tuple[RadixTree, np.ndarray]:
    tree = RadixTree()
    docs = [rng.integers(0, 150_000, prompt_len) for _ in range(4)]
    for i in range(n_seqs):
        doc = docs[i % len(docs)]
        cut = int(rng.integers(1_000, prompt_len))
        tail = rng.integers(0, 150_000, int(rng.integers(16, 2_000)))
        tree.insert(np.concatenate([doc[:cut], tail]))
    prompt = np.concatenate([docs[0][: prompt_len - 4096], rng.integers(0, 150_000, 4096)])
    return tree, prompt


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--prompt", type=int, default=131_072)
    ap.add_argument("--seqs", type=int, default=1_000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    tree, prompt = build_tree(rng, args.seqs, args.prompt)
    print(f"tree: {args.seqs} sequences, {len(tree)} nodes, built in {time.perf_counter() - t0:.1f}s")
    repeat = 3 if args.quick else 10
    as_list = prompt.tolist()
    m = tree.match(prompt)
    radix_min, radix_med = best_of(lambda: tree.match(prompt), repeat)
    vllm_min, vllm_med = best_of(lambda: vllm_block_hashes(as_list), repeat)
    ours_min, ours_med = best_of(lambda: chain_hashes(prompt, 16), repeat)
    print(f"prompt {prompt.size} tokens, matched {m.length} tokens over {len(m.path)} nodes")
    print(f"{'method':42s} {'best ms':>9s} {'median ms':>10s}")
    print(f"{'radix match':42s} {radix_min * 1e3:9.2f} {radix_med * 1e3:10.2f}")
    print(f"{'vLLM-style sha256 16-token block hashes':42s} {vllm_min * 1e3:9.2f} {vllm_med * 1e3:10.2f}")
    print(f"{'our blake3 16-token chain hashes':42s} {ours_min * 1e3:9.2f} {ours_med * 1e3:10.2f}")
    ratio = radix_min / vllm_min
    faster = f"{1 / ratio:.1f}x faster" if ratio < 1 else f"{ratio:.1f}x slower"
    print(f"radix match / vLLM-style block hashing of the same prompt (best of {repeat}): "
          f"{ratio:.3f} (radix {faster})")


if __name__ == "__main__":
    main()
