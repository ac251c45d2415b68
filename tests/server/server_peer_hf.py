"""The first engine process of tests/server/test_server_hf.py: a transformers runtime
(tiny hybrid model, fixed seed: the same weights in every process) in server mode; it
serves two requests branching at token 64 and exits."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hf"))

import torch  # noqa: E402
from hf_support import config, random_tokens, tiny_model  # noqa: E402

from hybrid_connector.integrations.hf import HFRuntime  # noqa: E402


def server_mode(url: str):  # type: ignore[no-untyped-def]
    return config(cache_server={"url": url, "timeout_s": 60.0})


def main(arch: str, url: str, out: str) -> None:
    torch.set_num_threads(1)
    model = tiny_model(arch)
    vocab = model.config.vocab_size
    rt = HFRuntime.create(model, server_mode(url))
    prefix = random_tokens(64, vocab, 31)
    for seed in (32, 33):  # the second request checkpoints the branch at 64
        r = rt.prefill(prefix + random_tokens(20, vocab, seed))
        rt.decode(r, 3)
        rt.finish(r)
    rt.cache.flush()
    rt.close()
    rt.cache.close()
    Path(out).write_text("done")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
