"""A layer-wise hit for the transformers runtime: loads through the copy engine, overlapped
with the suffix's prefill (the GPU TTFT benchmark's data path).

``HFRuntime.prefill`` loads a hit synchronously (read every object, restore, then run the
suffix). Here the same hit (the same ``RequestSession`` plan, lease and objects) is read by
a ``hybrid_connector.tiers.copy_engine.CopyEngine`` job instead: one transfer per object, the state
checkpoint first (the first decoder layers are GDN layers), then the KV chunks in order.
Each transfer reads its object from the tier that holds it into a device staging buffer
(device tier: device-to-device; pinned host tier: host-to-device from the slab; NVMe: the
file into a pinned bounce buffer on a copy-engine worker, then host-to-device on the copy
stream) and its ``post`` hook moves the bytes into the model's cache with ``hybrid_connector/kernels/``
(``hf_pack``: row scatters for K and V, conv rows and one page copy for the states). A
forward pre-hook on each decoder layer waits for what that layer reads (GDN layers: the
state; attention layers: every KV chunk) on the compute stream, so layers run as soon as
their inputs landed while later objects are still in flight.

The KV chunk objects hold every attention layer (chunk-major, as stored), so the first
attention layer waits for all chunks: the load can hide under the compute of the layers
before it and of whatever the GPU has queued; the measured hidden share says how much did.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from hybrid_connector.index.plan import LoadPlan, PlannedObject
from hybrid_connector.integrations.hf import pack as hf_pack
from hybrid_connector.integrations.hf.runtime import HFRuntime
from hybrid_connector.integrations.hf.state import decoder_layers, new_model_cache
from hybrid_connector.payload.layout import kv_layout
from hybrid_connector.runtime.session import RequestSession
from hybrid_connector.tiers.copy_engine import CopyEngine, LayerTransfer, TransferJob
from hybrid_connector.tiers.manager import TieredStore


@dataclass
class Staged:
    """Reusable buffers of one hit: device staging per object (and pinned bounce buffers
    for a file tier), keyed by the object's key string."""

    device: dict[str, torch.Tensor] = field(default_factory=dict)
    bounce: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Hit:
    """A layer-wise hit in flight: the session (holding the plan's lease), the model cache
    being filled, the copy job and the transfers' names in submission order."""

    session: RequestSession
    mc: Any
    job: TransferJob
    names: list[str]
    transfers: list[LayerTransfer]
    staged: Staged

    def wait_all(self) -> None:
        for name in self.names:
            self.job.wait(name)

    def release(self) -> None:
        self.wait_all()  # the lease covers the reads
        self.session.release()


class LayerwiseLoader:
    """Layer-wise exact hits of ``rt`` over ``store``, through ``engine``."""

    def __init__(self, rt: HFRuntime, store: TieredStore, engine: CopyEngine, *,
                 file_tier: bool) -> None:
        self.rt, self.store, self.engine, self.file_tier = rt, store, engine, file_tier
        self.device = next(rt.model.parameters()).device
        self._staged: dict[int, Staged] = {}

    # -------------------------------------------------------------- buffers
    def _buffers(self, plan: LoadPlan) -> Staged:
        """Staging for ``plan``'s objects, allocated once per hit length and reused."""
        st = self._staged.setdefault(plan.num_tokens, Staged())
        pin = self.file_tier and self.device.type == "cuda"
        for o in (plan.state, *plan.kv):
            assert o is not None
            name = o.ref.key.to_str()
            if name in st.device:
                continue
            meta = self.store.tier(o.tier).meta(o.ref.key)
            if meta is None:
                raise RuntimeError(f"{name}: not in tier {o.tier}")
            shape, dtype = meta[0], meta[1]
            st.device[name] = torch.empty(shape, dtype=dtype, device=self.device)
            if self.file_tier:
                st.bounce[name] = torch.empty(shape, dtype=dtype, pin_memory=pin)
        return st

    def _read(self, o: PlannedObject, out: torch.Tensor) -> Callable[[], torch.Tensor]:
        tier = self.store.tier(o.tier)

        def fetch() -> torch.Tensor:
            if not tier.get_into([o.ref.key], [out])[0]:
                raise RuntimeError(f"read of {o.ref.key.to_str()} from {o.tier} failed")
            return out
        return fetch

    # -------------------------------------------------------------- the hit
    def prepare_cache(self, plan: LoadPlan) -> tuple[Any, list[torch.Tensor], torch.Tensor | None]:
        """A model cache shaped for a hit of ``plan.num_tokens`` (KV buffers allocated, states
        initialised), the K/V tensors it holds (the scatter destinations, K then V per
        attention layer) and, when they are views of one allocation, that allocation
        (``hf_pack.kv_buffers``: a whole chunk then lands in one kernel call)."""
        rt, p = self.rt, plan.num_tokens
        ad = rt.adapter
        mc = new_model_cache(rt.model)
        dests, joint = hf_pack.kv_buffers([(a.kv_heads, dim, a.dtype) for a in ad.attention
                                           for dim in (a.head_dim, a.v_dim)], p, self.device)
        for j, a in enumerate(ad.attention):  # the scatters' targets, held without a copy
            hf_pack.adopt_kv(mc.layers[a.layer], dests[2 * j], dests[2 * j + 1])
        zero = ad.state_layout.empty(self.device).zero_()
        ad.set_states(mc, ad.unpack_state(zero))
        return mc, dests, joint

    def _transfers(self, plan: LoadPlan, mc: Any, dests: list[torch.Tensor],
                   joint: torch.Tensor | None, st: Staged) -> list[LayerTransfer]:
        ad, p = self.rt.adapter, plan.num_tokens
        out: list[LayerTransfer] = []
        assert plan.state is not None
        for o in (plan.state, *plan.kv):
            name = o.ref.key.to_str()
            if o is plan.state:
                def post(landed: torch.Tensor) -> None:
                    ad.set_states(mc, ad.unpack_state(landed))
            else:
                s, e = o.ref.key.start, o.ref.key.end

                def post(landed: torch.Tensor, s: int = s, e: int = e) -> None:
                    parts = kv_layout(ad.geometry, e - s).unpack(landed)
                    hf_pack.scatter_kv_chunk(list(parts.values()), dests, joint, s, min(e, p) - s)
            if self.file_tier:
                out.append(LayerTransfer(name, dst=st.device[name],
                                         fetch=self._read(o, st.bounce[name]), post=post))
            else:
                out.append(LayerTransfer(name, fetch=self._read(o, st.device[name]), post=post))
        return out

    def start(self, tokens: list[int], expect: int) -> Hit:
        """Look ``tokens`` up, lease the plan and start loading it (raises RuntimeError
        unless the plan is an exact hit of ``expect`` tokens with a state)."""
        s = RequestSession(self.rt.cache, tokens, alignment=self.rt.alignment)
        plan = s.plan
        if not plan.hit or not plan.exact or plan.state is None or plan.num_tokens != expect:
            s.release()
            raise RuntimeError(f"expected an exact hit, got {plan.num_tokens} tokens, exact={plan.exact}")
        s.lease = self.rt.cache.acquire(plan)
        if s.lease is None:
            raise RuntimeError("the plan went stale before it was leased")
        s.hit = plan.num_tokens
        st = self._buffers(plan)
        mc, dests, joint = self.prepare_cache(plan)
        transfers = self._transfers(plan, mc, dests, joint, st)
        job = self.engine.submit_layers(transfers)
        return Hit(s, mc, job, [t.name for t in transfers], transfers, st)

    @contextlib.contextmanager
    def layer_waits(self, hit: Hit) -> Iterator[None]:
        """Forward pre-hooks: each decoder layer waits (on the compute stream) for the
        objects it reads, once per hit."""
        ad = self.rt.adapter
        att = {a.layer for a in ad.attention}
        rec = {s.layer for s in ad.recurrent}
        state_name, kv_names = hit.names[0], hit.names[1:]
        waited: set[str] = set()

        def waiter(names: list[str]) -> Callable[..., None]:
            def hook(_mod: Any, _args: Any) -> None:
                for n in names:
                    if n not in waited:
                        hit.job.wait(n)
                        waited.add(n)
            return hook

        handles = []
        for i, layer in enumerate(decoder_layers(self.rt.model)):
            need = ([state_name] if i in rec else []) + (kv_names if i in att else [])
            if need:
                handles.append(layer.register_forward_pre_hook(waiter(need)))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def run_suffix(self, hit: Hit, tokens: list[int]) -> torch.Tensor:
        """Prefill ``tokens[p:]`` into the hit's cache while it loads; the last logits."""
        p = hit.session.hit
        ids = torch.as_tensor(tokens, dtype=torch.long)
        with self.layer_waits(hit):
            return self.rt._run(ids[p:], hit.mc, p)

    def posts_only(self, hit: Hit) -> None:
        """Run every transfer's kernel moves again from the staged bytes (on the current
        stream): the kernels' share of a load, for their bandwidth."""
        for t in hit.transfers:
            t.post(hit.staged.device[t.name])  # type: ignore[misc]
