"""``ManifestAccess``: the remote tier's manifest API (``append_record``, ``records``), a
mixin of ``hybrid_connector.tiers.remote.tier.RemoteTier``. Formats and semantics: ``hybrid_connector.tiers.manifest``.

Both calls run as one client call under one deadline, through the tier's guard (an
unreachable server is False / [] at once while it is marked down) and never raise for
anything the server does. A manifest the server holds but that is unusable (corrupt,
hostile, over this tier's limits) is False / [] too, logged, and does not mark the remote
down: the server answered, the data was bad.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from hybrid_connector.tiers import manifest
from hybrid_connector.tiers.manifest import CorruptManifest, Limits
from hybrid_connector.tiers.remote.clients import ReplyTooLarge

if TYPE_CHECKING:
    from hybrid_connector.tiers.remote.clients import RemoteClient

log = logging.getLogger("hybrid_connector.tiers.remote.tier")
T = TypeVar("T")
REFUSED = object()  # the server answered, but with data we cannot use


class ManifestAccess:
    """Needs ``client``, ``limits``, ``name`` and ``_guard`` (see ``RemoteTier``)."""

    client: RemoteClient
    limits: Limits
    name: str

    def _guard(self, what: str, fn: Callable[[], T]) -> tuple[bool, T | None]:
        raise NotImplementedError

    def append_record(self, name: str, record: bytes) -> bool:
        """Append ``record`` to manifest ``name``. True once the server stored it; False
        when the record exceeds ``limits.max_record_bytes``, the server is unreachable or
        the stored manifest is unusable (it is then left as it is, except an lm:// one
        that is corrupt for every reader, which is replaced). ValueError for a malformed
        name or a record that is not bytes."""
        manifest.check_name(name)
        rec = manifest.check_record(record)
        if len(rec) > self.limits.max_record_bytes:
            log.warning("remote tier %s: manifest %r: a record of %d bytes exceeds %d",
                        self.name, name, len(rec), self.limits.max_record_bytes)
            return False
        ok, res = self._guard("append_record", lambda: self._refusable(
            lambda: self.client.append_record(name, rec), name))
        return ok and res is not REFUSED

    def records(self, name: str) -> list[bytes]:
        """The newest ``limits.max_records`` records of manifest ``name``, oldest first,
        each at most ``limits.max_record_bytes`` long; [] when there are none, the server
        is unreachable or the stored manifest is unusable. ValueError for a malformed
        name."""
        manifest.check_name(name)
        ok, res = self._guard("records", lambda: self._refusable(
            lambda: self.client.records(name), name))
        return res if ok and isinstance(res, list) else []

    def _refusable(self, fn: Callable[[], T], name: str) -> T | object:
        """``fn()``, or ``REFUSED`` where the server answered with an unusable manifest."""
        try:
            return fn()
        except (CorruptManifest, ReplyTooLarge) as exc:
            log.warning("remote tier %s: manifest %r is unusable: %s", self.name, name, exc)
            return REFUSED
