"""A tiny Qwen3.5 hybrid trained on this machine: byte tokenizer, corpus and weights.

Random weights forget within a few tokens, so replay measured on them looks exact. This
module ships a small model that was *trained* (``scripts/train_tiny.py``, a few minutes on
CPU) on text every machine has: the Python standard library's top-level ``*.py`` sources.

* Tokenizer: bytes. Token ``i`` (0..255) is the byte ``i`` of the UTF-8 text; there are no
  specials and nothing to download (:func:`encode`, :func:`decode`, :data:`VOCAB`).
* Corpus: the sorted ``*.py`` files of ``sysconfig.get_paths()["stdlib"]``. Files whose index
  is divisible by :data:`HELD_OUT_EVERY` are held out (never trained on); the rest are train
  (:func:`corpus_files`).
* Weights: ``hybrid_connector/presets/trained/`` holds ``config.json`` (a
  ``Qwen3_5TextConfig``) and ``model.safetensors`` (fp16, a few MB);
  :func:`load_trained_model` returns the fp32 ``Qwen3_5ForCausalLM`` in eval mode.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path
from typing import Any

import torch

VOCAB = 256
HELD_OUT_EVERY = 10
TRAINED_DIR = Path(__file__).resolve().parent.parent / "presets" / "trained"


def encode(text: str) -> list[int]:
    """UTF-8 bytes of ``text`` as token ids in [0, 256)."""
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    """Inverse of :func:`encode` (invalid UTF-8 sequences become U+FFFD)."""
    return bytes(ids).decode("utf-8", errors="replace")


def corpus_files(split: str, root: Path | None = None) -> list[Path]:
    """The stdlib sources of ``split`` ("train" or "heldout"), sorted by name; held-out is
    every :data:`HELD_OUT_EVERY`-th file, so the two never overlap."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    base = root if root is not None else Path(sysconfig.get_paths()["stdlib"])
    files = sorted(base.glob("*.py"))
    held = split == "heldout"
    return [f for i, f in enumerate(files) if (i % HELD_OUT_EVERY == 0) == held]


def corpus_tokens(split: str, root: Path | None = None, limit: int | None = None) -> torch.Tensor:
    """All bytes of ``split``'s files, concatenated (``[n]`` long), at most ``limit``."""
    data = b"".join(f.read_bytes() for f in corpus_files(split, root))
    if limit is not None:
        data = data[:limit]
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def trained_config(**overrides: Any) -> Any:
    """The ``Qwen3_5TextConfig`` the shipped model was trained with (from its config.json,
    or the script's defaults with ``overrides`` when training a new one)."""
    from transformers import Qwen3_5TextConfig

    path = TRAINED_DIR / "config.json"
    if path.exists() and not overrides:
        return Qwen3_5TextConfig(**json.loads(path.read_text()))
    kw: dict[str, Any] = {
        "vocab_size": VOCAB, "hidden_size": 192, "intermediate_size": 512,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 48,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                        "full_attention"],
        "linear_num_key_heads": 4, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
        "linear_value_head_dim": 48, "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 4096, "tie_word_embeddings": True,
        "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
    }
    kw.update(overrides)
    return Qwen3_5TextConfig(**kw)


def load_trained_model(directory: Path | None = None) -> Any:
    """The shipped trained model: fp32 ``Qwen3_5ForCausalLM`` in eval mode. FileNotFoundError
    when the weights are missing (run ``scripts/train_tiny.py``)."""
    from safetensors.torch import load_file
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    d = directory if directory is not None else TRAINED_DIR
    weights = d / "model.safetensors"
    if not weights.exists():
        raise FileNotFoundError(f"{weights}: no trained weights; run scripts/train_tiny.py")
    cfg = Qwen3_5TextConfig(**json.loads((d / "config.json").read_text()))
    model = Qwen3_5ForCausalLM(cfg)
    state = {k: v.float() for k, v in load_file(str(weights)).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{weights}: missing {missing}, unexpected {unexpected}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


@torch.no_grad()
def mean_loss(model: Any, tokens: torch.Tensor, seq: int, n_seqs: int) -> float:
    """Mean next-token cross-entropy (nats/byte) of ``model`` over the first ``n_seqs``
    disjoint windows of ``seq`` tokens of ``tokens``."""
    n = min(n_seqs, int(tokens.numel()) // seq)
    if n <= 0:
        raise ValueError(f"need at least {seq} tokens, got {tokens.numel()}")
    batch = tokens[: n * seq].view(n, seq)
    out = model(input_ids=batch, labels=batch)
    return float(out.loss)
