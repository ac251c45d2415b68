"""NVMe tier: one directory, one file per object, named by the key digest only.

Writes go to a hidden temporary file in the same directory, are fsynced, then atomically
renamed over the final name (the directory is fsynced once per ``put`` batch, before
``put`` returns), so a reader or a restart sees
either the complete old file, the complete new file, or nothing, whatever point a crash
hits. Every file carries a ``hybrid_connector.tiers.codec`` header (key, kind, shape, dtype, length,
checksum) and, when the put carried one, the object's ``ObjectMeta`` (written in the same
``writev``, checked by a CRC the header holds); reads verify the key, sizes and checksum,
and a file that fails is deleted and reported as a miss. At start the index is rebuilt
from the directory, metadata included (``inventory``): temporary files are deleted, files
with a bad or inconsistent header or metadata (or a wrong name) are dropped, and if the
budget shrank the oldest files go first. Only regular files are ever read: a symlink,
FIFO, device or directory under an object name is refused without a blocking open (so it
cannot hang start-up or a read) and dropped like a corrupt file. ``remove`` deletes the
file at once; where the filesystem refuses, see ``NvmeTier.remove`` (a tombstone keeps
the object from coming back after a restart, or, on a read-only filesystem, the object
stays and ``remove`` says False).

``verify_reads=False`` skips the payload checksum on raw reads (header, key, dtype, shape
and exact length are still checked, and atomic renames already rule out torn files); it
trades detection of silent media corruption for read bandwidth (see benchmarks/tiers.py).

The directory belongs to one live tier instance: ``hybrid_connector.tiers.dirlock`` locks it from before the
start-up scan until ``close`` (or the process's death), and a second opener (which would
delete the first one's files as debris or to fit its budget) gets ``DirectoryLocked``.

Optional zstd per kind (``zstd={ObjectKind.STATE: 3}``). Budgets count payload bytes (as
every tier does); each file adds one header (< 1 KiB) and its metadata, if any (1.3 KiB
for a 256-token KV chunk, see benchmarks/restart.py), on disk. A batch runs on
``io_threads`` workers: ``put`` is one group commit (``hybrid_connector.tiers.group_commit``), ``get_into``
reads in parallel with plain ``preadv`` into the caller's buffers (one copy from the page
cache). No O_DIRECT: in ``benchmarks/tiers.py --peer`` it reads warm files 2-4x slower,
and cold ones about as fast as these parallel buffered reads.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import re
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path

import torch

from hybrid_connector.core.keys import ObjectKey, ObjectKind
from hybrid_connector.core.meta import ObjectMeta
from hybrid_connector.tiers import codec
from hybrid_connector.tiers.dirlock import DirLock
from hybrid_connector.tiers.fileio import HeadCache, read_tombstone, write_tombstone
from hybrid_connector.tiers.fileio import check_size as _check_size_fn
from hybrid_connector.tiers.fileio import open_regular as _open_regular
from hybrid_connector.tiers.fileio import read_checked as _read_checked
from hybrid_connector.tiers.fileio import read_exact as _read_exact
from hybrid_connector.tiers.fileio import read_head as _read_head_fn
from hybrid_connector.tiers.fileio import write_file as _write_file
from hybrid_connector.tiers.group_commit import IoPool, alloc_and_get, get_batch, put_batch
from hybrid_connector.tiers.indexed import IndexedTier
from hybrid_connector.tiers.logonce import LogOnce
from hybrid_connector.tiers.tier import TierRecord, byte_view, check_metas

log = logging.getLogger(__name__)
_NAME_RE = re.compile(r"^[0-9a-f]{40}$")
_TMP_SUFFIX = ".tmp"
_TOMB_RE = re.compile(r"^\.([0-9a-f]{40})\.tomb$")  # ".<digest>.tomb"


class NvmeTier(IndexedTier):
    """Files in ``path``; see the module docstring and ``hybrid_connector.tiers.tier.Tier``.

    ``io_threads``: workers for the files of one batch (1: all on the caller's thread);
    ``joint``: kinds sharing one budget (``pools.disk.kv_state``). Raises ValueError if
    ``path`` exists and is not a directory (or ``io_threads`` < 1), ``DirectoryLocked`` if
    a live store holds it, OSError if it cannot be created. Everything after construction
    reports failures as misses or False.
    """

    slow = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        budgets: Mapping[ObjectKind, int],
        name: str = "nvme",
        zstd: Mapping[ObjectKind, int] | None = None,
        fsync: bool = True,
        verify_on_start: bool = False,
        verify_reads: bool = True,
        io_threads: int = 4,
        joint: Collection[ObjectKind] = (),
    ) -> None:
        super().__init__(name, budgets, joint)
        self._pool = IoPool(io_threads, f"nvme-{name}")
        self._heads = HeadCache()  # validated headers: a read compares bytes, not parses
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"nvme tier path {self.path} exists and is not a directory")
        self.path.mkdir(parents=True, exist_ok=True)
        self._claim = DirLock(self.path)  # before the scan reads or deletes any file
        self._dir = str(self.path)
        self.zstd = dict(zstd or {})
        self.fsync = fsync
        self.verify_reads = verify_reads
        self._warn = LogOnce(log)
        self._seq = itertools.count()
        self.dropped_at_start: list[str] = []
        # Keys whose file could be neither deleted nor tombstoned (read-only filesystem):
        # still held, but never offered by ``lru`` (nobody could move them).
        self._stuck: set[ObjectKey] = set()
        self._rebuild(verify_on_start)

    # ------------------------------------------------------------------ batches
    def put(self, items: Sequence[tuple[ObjectKey, torch.Tensor]],
            metas: Sequence[ObjectMeta | None] | None = None) -> list[bool]:
        """``Tier.put`` as one group commit on the I/O pool (``hybrid_connector.tiers.group_commit``): the
        files are written and fsynced in parallel, each renamed after its own fsync, then
        one directory fsync; with ``fsync`` on, every True is durable on return."""
        out = put_batch(self, self._pool, items, check_metas(items, metas))
        if any(out):
            self._after_batch()
        return out

    def get_into(self, keys: Sequence[ObjectKey], outs: Sequence[torch.Tensor]) -> list[bool]:
        """``Tier.get_into`` with the reads (and checksums) of a batch on the I/O pool."""
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} buffers")
        return get_batch(self, self._pool, keys, outs)

    def get(self, keys: Sequence[ObjectKey], device: torch.device | str | None = None
            ) -> list[torch.Tensor | None]:
        return alloc_and_get(self, self._pool, keys, device)

    def close(self) -> None:
        """Stop the I/O pool and release the directory (a later store may open it)."""
        self._pool.close()
        self._claim.release()

    # ------------------------------------------------------------------ start
    def _rebuild(self, verify: bool) -> None:
        found: list[tuple[float, TierRecord]] = []
        paths = list(self.path.iterdir())
        tombs = {m.group(1): p for p in paths if (m := _TOMB_RE.match(p.name))}
        for p in paths:
            name = p.name
            if name.startswith(".") and name.endswith(_TMP_SUFFIX):
                self._unlink(p)  # a write that never reached its rename
                continue
            if not _NAME_RE.match(name):
                continue  # not ours (tombstones included); leave it alone
            tomb = tombs.pop(name, None)
            if tomb is not None and self._buried(p, tomb):
                continue  # removed by a caller: never indexed again
            try:
                found.append(self._scan(p, verify))
            except (OSError, codec.CorruptObject) as exc:
                self.dropped_at_start.append(name)
                log.warning("nvme tier %s: dropping %s at start: %s", self.name, name, exc)
                self._unlink(p)
        # Newest first, so a shrunk budget keeps the most recent files; then insert oldest
        # first so the LRU order follows the files' ages.
        found.sort(key=lambda x: x[0], reverse=True)
        kept: list[TierRecord] = []
        for _, e in found:
            if self._pool_used(e.key.kind) + e.nbytes > self._budget[e.key.kind]:
                self.dropped_at_start.append(str(e.handle))
                self._unlink(self._file(e.key))
                continue
            self._used[e.key.kind] += e.nbytes
            kept.append(e)
        for e in reversed(kept):
            self._lru[e.key.kind][e.key] = e
        for tomb in tombs.values():  # their files are gone
            self._unlink(tomb)
        if self.dropped_at_start:
            log.warning("nvme tier %s: dropped %d files at start", self.name,
                        len(self.dropped_at_start))

    def _scan(self, p: Path, verify: bool) -> tuple[float, TierRecord]:
        """(mtime, entry) of the object file ``p``; OSError or CorruptObject if it is not
        a regular file holding a valid object under its own name."""
        fd, st = _open_regular(p)
        try:
            h, hend, head = self._read_head(fd)
            off = hend + h.meta_len  # the body's offset
            self._check_size(fd, h, off)  # so the file bounds meta_len before it is read
            body_head = head[off : off + codec.ZSTD_FRAME_HEADER_MAX]
            if len(body_head) < min(codec.ZSTD_FRAME_HEADER_MAX, h.stored):  # a long header
                body_head = os.pread(fd, codec.ZSTD_FRAME_HEADER_MAX, off)
            codec.check_frame(h, body_head)
            key = ObjectKey.from_str(h.key)
            if key.digest() != p.name or key.kind.value != h.kind:
                raise codec.CorruptObject("file name or kind does not match its key")
            mbytes: codec.Buf = head[hend:off]
            if len(mbytes) < h.meta_len:  # metadata longer than the first read
                mbytes = bytearray(h.meta_len)
                _read_exact(fd, memoryview(mbytes), hend)
            meta = codec.decode_meta(h, mbytes, key)
            self._heads.remember(str(p), head, h)
            if verify:
                out = torch.empty(h.shape, dtype=h.torch_dtype)
                body = bytearray(h.stored)
                _read_exact(fd, memoryview(body), off)
                codec.decode_into(h, body, out)
        except ValueError as exc:
            raise codec.CorruptObject(str(exc)) from exc
        finally:
            os.close(fd)
        return st.st_mtime, TierRecord(key, h.nbytes, h.shape, h.torch_dtype, handle=str(p),
                                  meta=meta)

    @staticmethod
    def _read_header(fd: int) -> tuple[codec.Header, int]:
        """(validated header, offset of the body, after any metadata); CorruptObject if
        malformed. The metadata is not read."""
        h, hend, _ = NvmeTier._read_head(fd)
        return h, hend + h.meta_len

    _read_head = staticmethod(_read_head_fn)
    _check_size = staticmethod(_check_size_fn)

    # ------------------------------------------------------------------ storage
    def _file(self, key: ObjectKey) -> Path:
        return self.path / key.digest()

    def _unlink(self, p: Path) -> bool:
        """Delete ``p``; False (logged once) when the filesystem refuses."""
        try:
            if p.is_dir() and not p.is_symlink():
                p.rmdir()  # an (empty) directory squatting on an object name
            else:
                p.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._warn.warn("unlink", "nvme tier %s: cannot delete %s: %s", self.name, p, exc)
            return False
        return True

    # ------------------------------------------------------------------ removal
    def remove(self, keys: Sequence[ObjectKey]) -> list[bool]:
        """``Tier.remove``, honest about the filesystem: an unpinned object's file is
        deleted now. If the filesystem refuses (an immutable file, EPERM, EIO), a
        tombstone ``.<digest>.tomb`` recording the file's identity makes the removal
        durable instead: the object is gone now and is never indexed again, and the next
        start deletes file and tombstone once it can. If not even the tombstone can be
        written (a read-only filesystem), the object stays: still held, readable and
        counted, no longer offered by ``lru``, and the answer for it is False. A pinned
        object is released at its last unpin the same way (file, else tombstone); on a
        read-only filesystem its removal is refused up front."""
        out = []
        with self._lock:
            for k in keys:
                e = self._entry(k)
                if e is not None and e.pins == 0 and not self._inflight.get(k):
                    if not self._retire(k):
                        self._stuck.add(k)
                        out.append(False)
                        continue
                    e.handle = None  # its file is gone or tombstoned: nothing to release
                elif e is not None and self._read_only():
                    self._stuck.add(k)
                    out.append(False)
                    continue
                self._stuck.discard(k)
                out.extend(super().remove([k]))
        return out

    def lru(self, kind: ObjectKind) -> Iterator[ObjectKey]:
        with self._lock:
            return iter([k for k in super().lru(kind) if k not in self._stuck])

    def _read_only(self) -> bool:
        try:
            return bool(os.statvfs(self.path).f_flag & os.ST_RDONLY)
        except OSError:
            return True

    def _retire(self, key: ObjectKey) -> bool:
        """Delete ``key``'s file or, when the filesystem refuses, tombstone it; False when
        neither worked (the file stays and would come back at a restart)."""
        p = self._file(key)
        self._heads.forget(str(p))
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        if self._unlink(p):
            return True
        tmp = self.path / f".{key.digest()}.{os.getpid()}.{next(self._seq)}{_TMP_SUFFIX}"
        try:
            write_tombstone(self.path / f".{key.digest()}.tomb", tmp, st, self.fsync)
            return True
        except OSError as exc:
            self._warn.warn("tomb", "nvme tier %s: cannot tombstone undeletable %s: %s",
                            self.name, p, exc)
            self._unlink(tmp)
            return False

    def _buried(self, p: Path, tomb: Path) -> bool:
        """At start: whether the object file ``p`` is the one ``tomb`` recorded as removed
        (then both are deleted if the filesystem now allows). A tombstone of an older file
        (the key was stored again since) is deleted and the file is scanned as usual."""
        try:
            st = os.lstat(p)
            same = (st.st_ino, st.st_size, st.st_mtime_ns) == read_tombstone(tomb)
        except (OSError, ValueError):
            same = False
        if not same or self._unlink(p):
            self._unlink(tomb)  # keep it only while its file is still there
        return same

    def _store(self, key: ObjectKey, payload: torch.Tensor, token: object) -> object | None:
        return self._store_with_meta(key, payload, token, None)

    def _store_with_meta(self, key: ObjectKey, payload: torch.Tensor, token: object,
                         meta: ObjectMeta | None) -> object | None:
        # Plain strings on this path: pathlib costs more than the rename of a small file.
        name = key.digest()
        final = f"{self._dir}/{name}"
        tmp = f"{self._dir}/.{name}.{os.getpid()}.{threading.get_ident()}.{next(self._seq)}{_TMP_SUFFIX}"
        try:  # header and metadata go out in the head, one writev with the body
            head, body = codec.encode(key, payload, self.zstd.get(key.kind), meta)
        except Exception as exc:  # e.g. MemoryError compressing: a failed put, not a crash
            self._warn.warn("encode", "nvme tier %s: cannot encode: %s", self.name, exc)
            return None
        try:
            _write_file(tmp, self.fsync, head, body)
            os.rename(tmp, final)  # only after the bytes are durable (with fsync)
            self._heads.remember(final, head)
            with self._lock:
                self._stuck.discard(key)  # a new file: deletable again, as far as we know
            return final
        except OSError as exc:
            reason = "disk full" if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) else "write"
            self._warn.warn(reason, "nvme tier %s: put failed (%s): %s", self.name, reason, exc)
            self._unlink(Path(tmp))
            return None

    def _after_batch(self) -> None:
        # One directory fsync per batch makes every rename of the batch durable before
        # ``put`` returns (a per-file directory fsync costs as much as the data fsync).
        if self.fsync:
            try:
                self._fsync_dir()
            except OSError as exc:
                self._warn.warn("fsync", "nvme tier %s: directory fsync failed: %s", self.name, exc)

    def _fsync_dir(self) -> None:
        dfd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _load_into(self, entry: TierRecord, out: torch.Tensor) -> bool:
        path = str(entry.handle)
        try:
            fd, st = _open_regular(path)
        except (OSError, codec.CorruptObject) as exc:
            self._warn.warn("read", "nvme tier %s: cannot open %s: %s", self.name, path, exc)
            return False
        try:
            h, hend, known = self._heads.read(fd, path, entry)
            if not known:  # else these exact header bytes already matched this entry
                if (h.shape != entry.shape or h.torch_dtype != entry.dtype
                        or h.key != entry.key.to_str()):
                    raise codec.CorruptObject("header does not match the index")
                self._heads.vouch(path, h, entry)
            if st.st_size != hend + h.stored:  # the file may have changed since the scan
                raise codec.CorruptObject(f"size {st.st_size} != {hend + h.stored}")
            if h.codec == "raw" and out.device.type == "cpu":
                # Straight into the caller's buffer, hashing each chunk while it is still
                # in cache (one pass over memory instead of two).
                hasher = codec.new_checksum(like=h.checksum) if self.verify_reads else None
                _read_checked(fd, byte_view(out), hend, hasher)
                if hasher is not None and hasher.tag() != h.checksum:
                    raise codec.CorruptObject("payload checksum mismatch")
            else:
                body = bytearray(h.stored)
                _read_exact(fd, memoryview(body), hend)
                codec.decode_into(h, body, out)
            return True
        except (OSError, codec.CorruptObject) as exc:
            self._warn.warn("corrupt", "nvme tier %s: dropping unreadable %s: %s",
                            self.name, entry.handle, exc)
            return False
        finally:
            os.close(fd)

    def _release(self, entry: TierRecord) -> None:
        # The file is named by key only: never delete it under a newer object or a put
        # of the same key that is about to register. No handle: ``remove`` retired it.
        if entry.handle is not None and not self._key_busy(entry.key):
            self._retire(entry.key)
