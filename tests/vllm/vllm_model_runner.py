"""The harness runner with real model compute: a tiny transformers model (the same config
vLLM inspected, random weights from a fixed seed) executes each scheduled chunk, reading
its KV and recurrent state from vLLM's paged buffers and writing them back, as vLLM's GPU
model runner does in align mode:

* KV of token t of a request lives in slot ``t % block_size`` of block
  ``block_ids[group][t // block_size]`` of each attention layer's K and V, read from vLLM's
  own page views the way the backend reads them (``Runner.kv``);
* the state after the step's last token goes to block ``cdiv(end, block_size) - 1`` of each
  Mamba/GDN layer (its ``[conv (kernel - 1, channels), recurrent]`` pages), and a step
  resumes from block ``(computed - 1) // block_size`` (what ``preprocess_mamba`` copies
  forward);
* the next token is the argmax of the last position's logits.

Exactness: the first time a request resumes at ``c > 0`` (a vLLM prefix hit or a connector
load), the KV and the state tensors it reads are compared with a full prefill of its first
``c`` tokens (``max_err``; a mismatch goes to ``bad``), so a lost or stale state cannot hide
behind logits of a random model.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm_harness import Req, Runner
from vllm_support import BLOCK

from hybrid_connector.geometry.model import ModelGeometry
from hybrid_connector.integrations.hf.state import HFStateAdapter, new_model_cache
from hybrid_connector.payload.layout import kv_layout

TOL = 1e-5  # relative to the tensor's scale (tests/hf/hf_support.py measured <= 6.8e-7)


def tiny_model(model_dir: str, seed: int = 0) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(model_dir)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def _layer(name: str) -> int:
    return int(name.split("layers.")[1].split(".")[0])


class ModelRunner(Runner):
    """A ``Runner`` whose "model" is a transformers model (see the module docstring)."""

    def __init__(self, cfg: Any, connector: Any | None, model_dir: str, seed: int = 0) -> None:
        super().__init__(cfg, connector)
        self.model = tiny_model(model_dir, seed)
        self.adapter = HFStateAdapter(self.model, ModelGeometry.from_hf_config(
            self.model.config, dtype="float32", state_dtype="float32"))
        self.max_err = 0.0
        self.resumed = 0
        groups = {g for g, _ in self.attn}
        assert len(groups) == 1, "the runner reads KV through one attention block table"

    # ------------------------------------------------------------ paged <-> model cache
    def _slots(self, r: Req, g: int, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.arange(a, b)
        blocks = torch.tensor([r.block_ids[g][i // BLOCK] for i in range(a, b)], dtype=torch.long)
        return blocks, t % BLOCK

    def _read_kv(self, r: Req, c: int) -> torch.Tensor:
        parts = {}
        for g, name in self.attn:
            blocks, slots = self._slots(r, g, 0, c)
            k, v = self.kv[name]
            i = _layer(name)
            parts[f"layers.{i}.k"] = k[blocks, slots]
            parts[f"layers.{i}.v"] = v[blocks, slots]
        return kv_layout(self.adapter.geometry, c).pack(parts)

    def _read_state(self, r: Req, c: int) -> torch.Tensor:
        parts = {}
        for g, name in self.mamba:
            blk = r.block_ids[g][(c - 1) // BLOCK]
            conv, rec = self.states[name]
            i = _layer(name)
            parts[f"layers.{i}.conv_state"] = conv[blk].t()
            parts[f"layers.{i}.recurrent_state"] = rec[blk]
        return self.adapter.state_layout.pack(parts)

    def _write(self, r: Req, mc: Any, c: int, end: int) -> None:
        kv = kv_layout(self.adapter.geometry, end - c).unpack(self.adapter.extract_kv(mc, c, end))
        for g, name in self.attn:
            blocks, slots = self._slots(r, g, c, end)
            i = _layer(name)
            k, v = self.kv[name]
            k[blocks, slots] = kv[f"layers.{i}.k"]
            v[blocks, slots] = kv[f"layers.{i}.v"]
        st = self.adapter.state_layout.unpack(self.adapter.extract_state(mc))
        for g, name in self.mamba:
            blk = r.block_ids[g][-(-end // BLOCK) - 1]
            conv, rec = self.states[name]
            i = _layer(name)
            conv[blk] = st[f"layers.{i}.conv_state"].t()
            rec[blk] = st[f"layers.{i}.recurrent_state"]

    @torch.no_grad()
    def _forward(self, mc: Any, ids: list[int], start: int) -> torch.Tensor:
        pos = torch.arange(start, start + len(ids)).unsqueeze(0)
        out = self.model(input_ids=torch.tensor([ids]), past_key_values=mc, position_ids=pos,
                         use_cache=True)
        return out.logits[0, -1].float()

    # ------------------------------------------------------------ Runner hooks
    def _check(self, rid: str, r: Req) -> None:
        c = r.computed
        if c == 0 or getattr(r, "verified", False):
            return
        r.verified = True  # type: ignore[attr-defined]
        self.resumed += 1
        ref = new_model_cache(self.model)
        self._forward(ref, r.tokens[:c], 0)
        for what, got, want in (("KV", self._read_kv(r, c), self.adapter.extract_kv(ref, 0, c)),
                                ("state", self._read_state(r, c), self.adapter.extract_state(ref))):
            err = float((got.float() - want.float()).abs().max())
            scale = max(1.0, float(want.float().abs().max()))
            self.max_err = max(self.max_err, err / scale)
            if err > TOL * scale:
                self.bad.append(f"{rid}: {what} at {c} differs from a full prefill by {err:.3g}")
        self.checked_tokens += c

    def _compute(self, r: Req, n: int) -> None:
        c = r.computed
        if c == 0:
            mc = new_model_cache(self.model)
        else:
            mc = self.adapter.restore([self._read_kv(r, c)], [(0, c)], c, self._read_state(r, c))
        r.logits = self._forward(mc, r.tokens[c : c + n], c)  # type: ignore[attr-defined]
        self._write(r, mc, c, c + n)
        self.computed_tokens += n
        r.computed = c + n

    def _sample(self, r: Req) -> int:
        return int(r.logits.argmax())  # type: ignore[attr-defined]
