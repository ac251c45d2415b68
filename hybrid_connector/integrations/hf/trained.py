"""Tiny hybrids trained on this machine (Qwen3.5, Nemotron-H): byte tokenizer, corpus, weights.

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
  ``arch="nemotron_h"``: ``hybrid_connector/presets/trained_nemotron_h/`` holds a tiny
  ``NemotronHForCausalLM`` (3 Mamba2 + 1 attention + 4 MLP layers), same tokenizer and corpus
  (:data:`TRAINED_ARCHS`, :func:`trained_dir`).
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path
from typing import Any

import torch

VOCAB = 256
HELD_OUT_EVERY = 10
TRAINED_DIR = Path(__file__).resolve().parents[2] / "presets" / "trained"
TRAINED_ARCHS = ("qwen3_5", "nemotron_h")
# Nemotron-H block pattern: Mamba2 and attention mixers, each but the last followed by a relu2
# MLP layer (transformers' names; "linear_attention" is a Mamba2 mixer).
NEMOTRON_H_BLOCKS = ["linear_attention", "mlp", "linear_attention", "mlp", "full_attention", "mlp",
                     "linear_attention", "mlp"]


def trained_dir(arch: str = "qwen3_5") -> Path:
    """Where the shipped weights of ``arch`` (one of :data:`TRAINED_ARCHS`) live."""
    if arch not in TRAINED_ARCHS:
        raise ValueError(f"arch must be one of {TRAINED_ARCHS}, got {arch!r}")
    return TRAINED_DIR if arch == "qwen3_5" else TRAINED_DIR.with_name(f"trained_{arch}")


def _config_class(arch: str) -> Any:
    import transformers

    trained_dir(arch)  # validates arch
    return transformers.Qwen3_5TextConfig if arch == "qwen3_5" else transformers.NemotronHConfig


def model_class(arch: str) -> Any:
    import transformers

    trained_dir(arch)
    return transformers.Qwen3_5ForCausalLM if arch == "qwen3_5" else transformers.NemotronHForCausalLM


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


def trained_config(arch: str = "qwen3_5", **overrides: Any) -> Any:
    """The config the shipped ``arch`` model was trained with (``Qwen3_5TextConfig`` or
    ``NemotronHConfig``; from its config.json, or the script's defaults with ``overrides``
    when training a new one)."""
    cls = _config_class(arch)
    path = trained_dir(arch) / "config.json"
    if path.exists() and not overrides:
        return cls(**json.loads(path.read_text()))
    if arch == "nemotron_h":
        return cls(**{**_NEMOTRON_H, **overrides})
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
    return cls(**kw)


_NEMOTRON_H: dict[str, Any] = {
    "vocab_size": VOCAB, "hidden_size": 192, "intermediate_size": 768,
    "layers_block_type": NEMOTRON_H_BLOCKS, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 48, "mamba_num_heads": 8, "mamba_head_dim": 48, "ssm_state_size": 32,
    "n_groups": 1, "conv_kernel": 4, "expand": 2, "chunk_size": 64,
    # NemotronHForCausalLM does not tie lm_head to the embeddings (transformers 5.2): untied.
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
    "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
}


def load_trained_model(directory: Path | None = None, arch: str = "qwen3_5") -> Any:
    """The shipped trained ``arch`` model in fp32, eval mode (``Qwen3_5ForCausalLM`` or
    ``NemotronHForCausalLM``). FileNotFoundError when the weights are missing (run
    ``scripts/train_tiny.py --arch ARCH``)."""
    from safetensors.torch import load_file

    d = directory if directory is not None else trained_dir(arch)
    weights = d / "model.safetensors"
    if not weights.exists():
        raise FileNotFoundError(f"{weights}: no trained weights; run scripts/train_tiny.py --arch {arch}")
    cfg = _config_class(arch)(**json.loads((d / "config.json").read_text()))
    model = model_class(arch)(cfg)
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
