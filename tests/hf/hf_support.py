"""Fixtures for the transformers runtime tests: tiny random-weight hybrid models on CPU."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from hybrid_connector.config import HybridConfig, load_config  # noqa: E402
from hybrid_connector.integrations.hf import HFRuntime  # noqa: E402
from hybrid_connector.integrations.hf_quality import long_memory_  # noqa: E402
from hybrid_connector.integrations.hf_state import new_model_cache  # noqa: E402
from hybrid_connector.keys import ObjectKind  # noqa: E402
from hybrid_connector.model_presets import tiny_hf_config  # noqa: E402
from tiers.memory import MemoryStore  # noqa: E402

ARCHS = ("qwen3_5", "qwen3_next", "nemotron_h", "bamba", "jamba", "falcon_h1", "granitemoehybrid",
         "lfm2")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # Tiny models are dominated by per-op overhead; two threads on a busy 2-core box make
    # every op ~20x slower. Restored after each test so other test areas are unaffected.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_model(arch: str, long_memory: bool = False, seed: int = 0) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_hf_config(arch)).eval()
    return long_memory_(model) if long_memory else model


def config(**over: Any) -> HybridConfig:
    # config.alignment stays at its default (16): the runtime resumes at any token (alignment 1).
    base: dict[str, Any] = {"chunk_size": 16, "hash_block_size": 16}
    base.update(over)
    return load_config(overrides=base, environ={})


def memory_store() -> MemoryStore:
    return MemoryStore({k: 1 << 30 for k in ObjectKind})


def runtime(model: Any, conf: HybridConfig | None = None, store: Any = None, **kw: Any) -> HFRuntime:
    return HFRuntime.create(model, conf or config(), store or memory_store(), **kw)


def random_tokens(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


@torch.no_grad()
def reference(model: Any, tokens: Sequence[int], n_new: int) -> tuple[torch.Tensor, list[int]]:
    """Full prefill without any connector: next-token logits and a greedy continuation."""
    mc = new_model_cache(model)
    logits = model(torch.tensor([list(tokens)]), past_key_values=mc, use_cache=True).logits[0, -1]
    first = logits.float()
    out: list[int] = []
    pos = len(tokens)
    for _ in range(n_new):
        tok = int(logits.argmax())
        out.append(tok)
        logits = model(torch.tensor([[tok]]), past_key_values=mc, use_cache=True,
                       position_ids=torch.tensor([[pos]])).logits[0, -1]
        pos += 1
    return first, out
