"""NIXL transfer backend for the NVMe tier (only where ``nixl`` imports).

``NixlNvmeTier`` keeps the ``NvmeTier`` file format, atomic rename and index rebuild, and
moves object bodies between DRAM and the file with a NIXL agent (POSIX plugin by default,
GDS where available) instead of ``os.write``/``readinto``. Headers stay plain POSIX I/O.

``nixl_available()`` says whether the bindings import; constructing the tier without them
raises ImportError naming the package. Not exercised on machines without nixl (tests skip).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import torch

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.tiers import codec
from hybrid_connector.tiers.fileio import write_all as _write_all
from hybrid_connector.tiers.nvme import NvmeTier
from hybrid_connector.tiers.tier import TierRecord


def _import_nixl() -> Any:
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError:
        try:
            from nixl_cu13._api import nixl_agent, nixl_agent_config
        except ImportError as exc:
            raise ImportError("the nixl tier needs the 'nixl' package (pip install nixl)") from exc
    return nixl_agent, nixl_agent_config


def nixl_available() -> bool:
    try:
        _import_nixl()
        return True
    except ImportError:
        return False


class NixlNvmeTier(NvmeTier):
    """``NvmeTier`` whose bodies move through a NIXL agent (see the module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        budgets: Mapping[ObjectKind, int],
        name: str = "nixl",
        backend: str = "POSIX",
        timeout: float = 30.0,
    ) -> None:
        nixl_agent, nixl_agent_config = _import_nixl()
        self._agent = nixl_agent(f"hc-{os.getpid()}-{id(self)}", nixl_agent_config(backends=[backend]))
        self._timeout = timeout
        # No zstd: bodies are raw DRAM<->file; one I/O thread: the agent is not shared.
        super().__init__(path, budgets, name=name, io_threads=1)

    def _xfer(self, op: str, buf: torch.Tensor, fd: int, offset: int) -> None:
        n = buf.numel() * buf.element_size()
        if n == 0:
            return
        mem = self._agent.register_memory(buf, "DRAM")
        files = self._agent.register_memory([(offset, n, fd, "")], "FILE")
        try:
            local = self._agent.get_xfer_descs([(buf.data_ptr(), n, 0)], "DRAM")
            remote = self._agent.get_xfer_descs([(offset, n, fd)], "FILE")
            h = self._agent.initialize_xfer(op, local, remote, self._agent.name)
            try:
                state = self._agent.transfer(h)
                deadline = time.monotonic() + self._timeout
                while state != "DONE":
                    if state == "ERR" or time.monotonic() > deadline:
                        raise OSError(f"nixl {op} failed ({state})")
                    state = self._agent.check_xfer_state(h)
            finally:
                self._agent.release_xfer_handle(h)
        finally:
            self._agent.deregister_memory(files)
            self._agent.deregister_memory(mem)

    def _store_with_meta(self, key: ObjectKey, payload: torch.Tensor, token: object,
                         meta: ObjectMeta | None) -> object | None:
        final = self._file(key)
        tmp = self.path / f".{final.name}.{os.getpid()}.nixl{next(self._seq)}.tmp"
        src = payload.detach().cpu().contiguous()
        head = codec.encode_header(key, src, src.numel() * src.element_size(), "raw",
                                   codec.checksum(codec.raw_bytes(src).data), meta)
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _write_all(fd, head)
                self._xfer("WRITE", src.reshape(-1).view(torch.uint8), fd, len(head))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, final)

            return final.name
        except OSError as exc:
            self._warn.warn("write", "nixl tier %s: put failed: %s", self.name, exc)
            self._unlink(tmp)
            return None

    def _load_into(self, entry: TierRecord, out: torch.Tensor) -> bool:
        if out.device.type != "cpu":
            return super()._load_into(entry, out)
        try:
            fd = os.open(self._file(entry.key), os.O_RDONLY)
        except OSError:
            return False
        try:
            h, hend = self._read_header(fd)
            if h.key != entry.key.to_str() or h.codec != "raw":
                return False
            self._xfer("READ", out.reshape(-1).view(torch.uint8), fd, hend)
            return codec.checksum(codec.raw_bytes(out).data, like=h.checksum) == h.checksum
        except (OSError, codec.CorruptObject):
            return False
        finally:
            os.close(fd)
