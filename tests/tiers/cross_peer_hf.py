"""The other instance for tests/tiers/test_cross_instance_hf.py: a transformers runtime
(tiny hybrid model, fixed seed: the same weights in both processes) whose cache keeps a
small host tier and shares the remote; it serves two requests branching at token 64."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hf"))

from hf_support import config, random_tokens, runtime, tiny_model  # noqa: E402

from hybrid_connector import assemble  # noqa: E402


def hf_config(url: str):  # type: ignore[no-untyped-def]
    return config(remote_url=url, remote_timeout_s=5.0,
                  pools={"host": {"kv": 1 << 22, "state": 1 << 22},
                         "remote": {"kv": 1 << 26, "state": 1 << 26}})


def serve_branching_pair(rt, vocab: int, out: str) -> None:  # type: ignore[no-untyped-def]
    """Two requests sharing a 64-token prefix (the second checkpoints the branch at 64),
    then flush and close ``rt`` and its cache, and write ``done`` to ``out``."""
    prefix = random_tokens(64, vocab, 31)
    for seed in (32, 33):
        r = rt.prefill(prefix + random_tokens(20, vocab, seed))
        rt.decode(r, 3)
        rt.finish(r)
    rt.cache.flush()
    rt.close()
    rt.cache.close()
    Path(out).write_text("done")


def main(arch: str, url: str, out: str) -> None:
    model = tiny_model(arch)
    rt = runtime(model, conf=hf_config(url), store=assemble.store(hf_config(url)))
    serve_branching_pair(rt, model.config.vocab_size, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
