"""Config sections of the cache server mode (see ``hybrid_connector.server``).

* ``server``: what ``hybrid-connector server`` listens on and the limits it enforces on
  every client (frame and object sizes, deadlines, in-flight bytes, the shared secret).
* ``cache_server``: an engine process in server mode: the index, policies and tiers live in
  the server at ``url``; the engine's cache is a ``ServerCache`` with the embedded cache's
  interface (``assemble.cache`` picks it by this key alone).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hybrid_connector.core.sizes import Bytes

SCHEME = "hc"  # hc://host:port: our server, lm:// framing plus the hybrid commands
DEFAULT_PORT = 65432


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ServerSettings(_Section):
    """``hybrid-connector server``. ``token``: when set, a connection must authenticate
    (``AUTH``) before any other command; LMCache's own ``lm://`` client cannot, so leave it
    unset (and bind loopback) when plain LMCache clients use the server. Deadlines: a frame
    whose header arrived must complete within ``frame_timeout_s`` plus its size at
    ``min_rate`` bytes/s (a trickling client is cut off); a connection idle for
    ``idle_timeout_s`` is closed. ``max_inflight_bytes`` bounds the bytes of all frames
    being received and of their replies from before they are made until drained (a frame
    or reply waits its turn rather than exhaust RAM). Before AUTH (token set) a connection
    may send only frames up to ``max_auth_frame_bytes`` and must succeed within
    ``auth_timeout_s``; at most ``max_unauthenticated`` wait at once. ``max_connections``
    (kept below the open-files limit) and ``max_connections_per_peer`` cap connections.
    ``admin_token``: when set, FLUSH needs it. HTTP listens on ``http_host`` (default
    ``host``); ``http_auth`` makes /stats and /metrics need a bearer token.
    ``docs/configuration.md`` ("server:") gives each key's default and meaning."""

    host: str = "127.0.0.1"
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)  # 0: any free port (printed at start)
    http_port: int | None = Field(None, ge=0, le=65535)  # health, stats, metrics; None: off
    token: str | None = Field(None, min_length=8)
    max_frame_bytes: Bytes = 1 << 30
    max_object_bytes: Bytes = 256 << 20
    max_inflight_bytes: Bytes = 4 << 30
    frame_timeout_s: float = Field(30.0, gt=0.0, allow_inf_nan=False)
    min_rate: Bytes = 32 << 20
    idle_timeout_s: float = Field(600.0, gt=0.0, allow_inf_nan=False)
    workers: int = Field(8, gt=0, le=256)  # threads running cache calls off the event loop
    plain_lmcache: bool = True  # serve LMCache's PUT/GET/EXIST/LIST/HEALTH
    # Service-layer bounds (``hybrid_connector.server.service``): model indexes at once
    # (at the cap, unused ones holding nothing are freed; beyond, HELLO is refused), a
    # lease's lifetime from ACQUIRE (None: the longest LOAD reply the deadlines allow, plus
    # 10 s), leases per session, and the share of any budget pool (a kind's pool over the
    # local tiers) one session's leases may pin.
    max_models: int = Field(64, gt=0)
    lease_timeout_s: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    max_leases_per_session: int = Field(1024, gt=0)
    max_pinned_fraction: float = Field(0.5, gt=0.0, le=1.0)
    # Before AUTH (token set): only a frame this small is read, within auth_timeout_s of
    # connecting, by at most max_unauthenticated connections (a new one closes the oldest).
    max_auth_frame_bytes: Bytes = Field(64 << 10, ge=1 << 10, le=16 << 20)
    auth_timeout_s: float = Field(10.0, gt=0.0, allow_inf_nan=False)
    max_unauthenticated: int = Field(64, gt=0, le=65536)
    # Connections open at once (also kept below the open-files limit) and per peer address.
    max_connections: int = Field(1024, gt=0)
    max_connections_per_peer: int = Field(512, gt=0)
    admin_token: str | None = Field(None, min_length=8)  # set: FLUSH needs it (as AUTH token)
    http_host: str | None = None  # None: ``host``
    http_auth: bool = False  # /stats and /metrics need ``Authorization: Bearer <token>``
    # Replies: one peer address's share of the reply room (None: half of
    # max_inflight_bytes; every engine on a node shares one address, so it must hold their
    # largest reply and more); a reply that makes no progress for stall_timeout_s is cut.
    max_reply_bytes_per_peer: Bytes | None = None
    stall_timeout_s: float = Field(5.0, gt=0.0, allow_inf_nan=False)
    # Freed heap memory the process keeps (``server.memory``): once the resident size is
    # malloc_slack_bytes above the server's own memory plus the bytes in flight, checked
    # every trim_interval_s, it is returned (malloc_trim). None: never trimmed. 512 MiB:
    # a trim makes the next buffers fault in again; benchmarks/server_load.py measured
    # ours/lmcache_server 0.55 at 64 MiB, 0.66 at 512 MiB, 0.89 never trimmed.
    malloc_slack_bytes: Bytes | None = 512 << 20
    trim_interval_s: float = Field(1.0, gt=0.0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _auth_fits(self) -> ServerSettings:
        for name in ("token", "admin_token"):
            secret = getattr(self, name)
            if secret is not None and len(secret.encode()) + 64 > self.max_auth_frame_bytes:
                raise ValueError(f"server.{name} does not fit in max_auth_frame_bytes")
        if self.http_auth and self.token is None and self.admin_token is None:
            raise ValueError("server.http_auth needs server.token or server.admin_token")
        return self

    @property
    def reply_share_bytes(self) -> int:
        """``max_reply_bytes_per_peer``, or half of ``max_inflight_bytes``."""
        if self.max_reply_bytes_per_peer is not None:
            return int(self.max_reply_bytes_per_peer)
        return int(self.max_inflight_bytes) // 2

    @property
    def lease_lifetime_s(self) -> float:
        """``lease_timeout_s``, or the longest LOAD (``frame_timeout_s`` plus a
        ``max_frame_bytes`` reply at ``min_rate``) plus 10 s."""
        if self.lease_timeout_s is not None:
            return self.lease_timeout_s
        return self.frame_timeout_s + self.max_frame_bytes / self.min_rate + 10.0


class ClientSettings(_Section):
    """An engine in server mode: ``url`` is ``hc://host:port``; ``timeout_s`` bounds each
    call (a server that does not answer in time is a miss for lookups and loads, a
    rejection for saves, never a hang)."""

    url: str
    token: str | None = None
    timeout_s: float = Field(30.0, gt=0.0, allow_inf_nan=False)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        host_port(v)
        return v


def host_port(url: str) -> tuple[str, int]:
    """``(host, port)`` of an ``hc://host[:port]`` URL; ValueError naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME or not parts.hostname:
        raise ValueError(f"cache server URL must be {SCHEME}://host:port, got {url!r}")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"bad port in cache server URL {url!r}: {exc}") from None
    return parts.hostname, port if port is not None else DEFAULT_PORT
