"""A payload: named tensors packed back to back in one contiguous 1-D tensor.

:class:`PayloadLayout` is the mechanics every cached object shares (what each kind holds is
``hybrid_connector.payload.layout``): its parts in order, each C-contiguous, without
padding, a part's byte offset the sum of the sizes of the parts before it. When every part
has one dtype the payload has that dtype, otherwise it is raw ``uint8`` bytes; readers also
accept the raw ``uint8`` bytes of a single-dtype payload.

Conversions (all raise ValueError naming the part that does not fit, before writing):
:meth:`PayloadLayout.pack` / :meth:`PayloadLayout.unpack` (payload <-> named tensors), and
:meth:`PayloadLayout.allocate` / :meth:`PayloadLayout.commit` for writers that fill the
parts in place (the kernels of ``hybrid_connector/kernels/``, the paged gather of
``hybrid_connector.payload.paged``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from hybrid_connector import kernels
from hybrid_connector.core.keys import ObjectKind
from hybrid_connector.geometry.layers import TensorSpec, canonical_dtype

__all__ = ["Part", "PayloadLayout", "torch_dtype"]


def torch_dtype(dtype: str) -> torch.dtype:
    """The ``torch.dtype`` of a dtype name (any spelling ``canonical_dtype`` accepts)."""
    dt = getattr(torch, canonical_dtype(dtype))
    assert isinstance(dt, torch.dtype)
    return dt


@dataclass(frozen=True)
class Part(TensorSpec):
    """A :class:`TensorSpec` at byte ``offset`` of a payload (``[offset, end)``)."""

    offset: int = 0

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)


@dataclass(frozen=True)
class PayloadLayout:
    """The parts of one payload of ``kind``, in order, with their byte offsets."""

    kind: ObjectKind
    parts: tuple[Part, ...]

    @classmethod
    def of(cls, kind: ObjectKind, specs: Sequence[TensorSpec]) -> PayloadLayout:
        """The layout of ``specs`` packed back to back in order. Raises ValueError for a
        repeated part name."""
        parts, off = [], 0
        for s in specs:
            parts.append(Part(s.name, tuple(s.shape), canonical_dtype(s.dtype), off))
            off += parts[-1].nbytes
        names = [p.name for p in parts]
        if len(set(names)) != len(names):
            raise ValueError(f"{kind.value} layout: repeated part names in {names}")
        return cls(kind, tuple(parts))

    # ------------------------------------------------------------------ queries
    @property
    def nbytes(self) -> int:
        return self.parts[-1].end if self.parts else 0

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts)

    @property
    def specs(self) -> tuple[TensorSpec, ...]:
        """The parts as plain ``TensorSpec`` (name, shape, dtype; no offsets), in order."""
        return tuple(TensorSpec(p.name, p.shape, p.dtype) for p in self.parts)

    @property
    def storage_dtype(self) -> torch.dtype:
        """The payload tensor's dtype: the parts' shared dtype, else ``torch.uint8``."""
        dtypes = {p.dtype for p in self.parts}
        return torch_dtype(dtypes.pop()) if len(dtypes) == 1 else torch.uint8

    def part(self, name: str) -> Part:
        """The part called ``name``; ValueError naming the layout's parts if there is none."""
        for p in self.parts:
            if p.name == name:
                return p
        raise ValueError(f"{self.kind.value} layout has no part {name!r}; parts: {list(self.names)}")

    # ------------------------------------------------------------------ payloads
    def empty(self, device: torch.device | str | None = None) -> torch.Tensor:
        """A new, uninitialised payload (1-D, ``storage_dtype``) on ``device``."""
        dt = self.storage_dtype
        return torch.empty(self.nbytes // dt.itemsize, dtype=dt, device=device)

    def as_bytes(self, payload: torch.Tensor) -> torch.Tensor:
        """``payload`` as 1-D ``uint8`` (a view when it is contiguous), checked for dtype and
        size; the ValueError for a wrong size names the part the payload ends in or after."""
        want = self.storage_dtype
        if payload.dtype not in (want, torch.uint8):
            raise ValueError(f"{self.kind.value} payload has dtype {payload.dtype}; its layout "
                             f"expects {want} (or raw uint8 bytes)")
        raw = payload.detach().contiguous().reshape(-1).view(torch.uint8)
        have = int(raw.numel())
        if have != self.nbytes:
            where = "it has no parts"
            if have < self.nbytes:
                p = next(p for p in self.parts if p.end > have)
                where = f"it ends inside part {p.name!r} (bytes [{p.offset}, {p.end}))"
            elif self.parts:
                where = f"{have - self.nbytes} bytes follow the last part {self.parts[-1].name!r}"
            raise ValueError(
                f"{self.kind.value} payload holds {have} bytes, its layout of {len(self.parts)} "
                f"parts expects {self.nbytes}: {where} (a payload of another model or layout?)")
        return raw

    @staticmethod
    def _view(raw: torch.Tensor, p: Part) -> torch.Tensor | None:
        """Part ``p`` of byte tensor ``raw`` as a typed view, or None when its offset is not
        aligned to its element size (a mixed-dtype payload with an odd-sized part before)."""
        try:
            return raw[p.offset : p.end].view(p.torch_dtype).view(p.shape)
        except RuntimeError:
            return None

    def unpack(self, payload: torch.Tensor) -> dict[str, torch.Tensor]:
        """Payload -> ``{part name: tensor}`` in layout order, each shaped and typed as its
        part: views into ``payload`` (copies for unaligned parts of a mixed payload, or when
        ``payload`` is not contiguous). Raises ValueError for a payload of another dtype or
        size, naming the part where it stops fitting."""
        raw = self.as_bytes(payload)
        out: dict[str, torch.Tensor] = {}
        for p in self.parts:
            v = self._view(raw, p)
            if v is None:  # unaligned: copy its bytes to a fresh (aligned) tensor
                v = raw[p.offset : p.end].clone().view(p.torch_dtype).view(p.shape)
            out[p.name] = v
        return out

    def allocate(self, device: torch.device | str | None = None
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A new payload and one writable tensor per part: a view into the payload where the
        part is aligned, else a staging tensor. Fill every part, then :meth:`commit`."""
        payload = self.empty(device)
        raw = payload.view(torch.uint8)
        views: dict[str, torch.Tensor] = {}
        for p in self.parts:
            v = self._view(raw, p)
            views[p.name] = v if v is not None else torch.empty(p.shape, dtype=p.torch_dtype,
                                                                device=payload.device)
        return payload, views

    def commit(self, payload: torch.Tensor, views: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Copy the staging tensors of :meth:`allocate` into ``payload``; return it."""
        raw = payload.view(torch.uint8)
        for p in self.parts:
            t = views[p.name]
            if t.untyped_storage().data_ptr() != raw.untyped_storage().data_ptr():
                raw[p.offset : p.end].copy_(t.contiguous().reshape(-1).view(torch.uint8))
        return payload

    def pack(self, tensors: Mapping[str, torch.Tensor] | Sequence[torch.Tensor]) -> torch.Tensor:
        """One new payload holding ``tensors`` (by part name, or in part order), which must
        match their parts in shape and dtype and share one device. Raises ValueError naming
        the missing, extra or mismatched part. Inputs are not modified. The bytes move in
        one ``kernels.copy_state_pages`` call (one launch on CUDA)."""
        if not self.parts:
            raise ValueError(f"{self.kind.value} layout: nothing to pack")
        if isinstance(tensors, Mapping):
            missing = [n for n in self.names if n not in tensors]
            extra = [n for n in tensors if n not in self.names]
            if missing or extra:
                raise ValueError(f"{self.kind.value} pack: missing parts {missing}, unknown parts {extra}")
            items = [tensors[n] for n in self.names]
        else:
            items = list(tensors)
            if len(items) != len(self.parts):
                raise ValueError(f"{self.kind.value} pack: {len(items)} tensors for "
                                 f"{len(self.parts)} parts")
        device = items[0].device
        for t, p in zip(items, self.parts, strict=True):
            if tuple(t.shape) != p.shape or t.dtype != p.torch_dtype:
                raise ValueError(f"{self.kind.value} pack: part {p.name!r} is {tuple(t.shape)} "
                                 f"{t.dtype}, expected {p.shape} {p.torch_dtype}")
            if t.device != device:
                raise ValueError(f"{self.kind.value} pack: part {p.name!r} is on {t.device}, "
                                 f"the first part on {device}")
        payload, views = self.allocate(device)
        src = [t.detach().contiguous().reshape(1, -1) for t, p in zip(items, self.parts, strict=True)
               if p.nbytes]
        dst = [views[p.name].reshape(1, -1) for p in self.parts if p.nbytes]
        if src:
            kernels.copy_state_pages(src, dst, [0], [0])
        return self.commit(payload, views)
