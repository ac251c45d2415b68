"""The first engine process of tests/server/test_server_hf.py: a transformers runtime
(tiny hybrid model, fixed seed: the same weights in every process) in server mode; it
serves two requests branching at token 64 (as tests/tiers/cross_peer_hf.py does over a
shared remote tier) and exits."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hf"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tiers"))

import torch  # noqa: E402
from cross_peer_hf import serve_branching_pair  # noqa: E402
from hf_support import config, tiny_model  # noqa: E402

from hybrid_connector.integrations.hf.runtime import HFRuntime  # noqa: E402


def server_mode(url: str):  # type: ignore[no-untyped-def]
    return config(cache_server={"url": url, "timeout_s": 60.0})


def main(arch: str, url: str, out: str) -> None:
    torch.set_num_threads(1)
    model = tiny_model(arch)
    serve_branching_pair(HFRuntime.create(model, server_mode(url)), model.config.vocab_size, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
