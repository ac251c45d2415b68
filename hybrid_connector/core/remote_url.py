"""The remote tier's URL: which store, checked at config load (``check_remote_url``) and
parsed by the tier (``parse_cluster_url``), so a malformed URL fails with one clear error.

Schemes: ``lm://host:port`` (``lmcache_server``); ``redis://``, ``rediss://``,
``valkey://``, ``valkeys://`` (one Redis-like server, redis-py's own URL syntax); and the
cluster schemes ``redis+cluster://``, ``rediss+cluster://``, ``valkey+cluster://``,
``valkeys+cluster://`` followed by ``[user[:password]@]host:port[,host:port...]`` (the
startup nodes of a Redis or Valkey Cluster; one reachable node is enough to discover the
rest), optionally ``/`` or ``/0`` (a cluster has only database 0) and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlparse

SINGLE = ("redis", "rediss", "valkey", "valkeys")
CLUSTER = tuple(f"{s}+cluster" for s in SINGLE)
SCHEMES = ("lm", *SINGLE, *CLUSTER)


@dataclass(frozen=True)
class ClusterURL:
    """A parsed cluster URL: startup ``nodes`` (host, port), TLS, credentials."""

    nodes: tuple[tuple[str, int], ...]
    tls: bool
    username: str | None = None
    password: str | None = None


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def parse_cluster_url(url: str) -> ClusterURL:
    """``ClusterURL`` of a ``<scheme>+cluster://`` URL; ValueError naming the problem."""
    scheme = scheme_of(url)
    if scheme not in CLUSTER:
        raise ValueError(f"remote url {url!r}: not a cluster URL ({', '.join(CLUSTER)})")
    rest = url.split("://", 1)[1]
    if "?" in rest or "#" in rest:
        raise ValueError(f"remote url {url!r}: a cluster URL takes no query or fragment")
    netloc, _, path = rest.partition("/")
    if path not in ("", "0"):
        raise ValueError(f"remote url {url!r}: a cluster has only database 0 (got /{path})")
    user = password = None
    if "@" in netloc:
        cred, netloc = netloc.rsplit("@", 1)
        u, sep, p = cred.partition(":")
        user, password = unquote(u) or None, unquote(p) if sep else None
    nodes = []
    for part in netloc.split(","):
        host, sep, port = part.strip().rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"remote url {url!r}: expected {scheme}://host:port[,host:port...] "
                             f"(bad node {part!r})")
        nodes.append((host, int(port)))
    return ClusterURL(tuple(nodes), scheme.startswith(("rediss", "valkeys")), user, password)


def check_remote_url(url: str) -> None:
    """ValueError when ``url`` names no store this project speaks, or is malformed."""
    scheme = scheme_of(url)
    if scheme not in SCHEMES:
        raise ValueError(f"remote url {url!r}: unsupported scheme {scheme!r} "
                         f"(expected one of {', '.join(SCHEMES)})")
    if scheme in CLUSTER:
        parse_cluster_url(url)
    elif scheme == "lm":
        u = urlparse(url)
        try:
            port = u.port
        except ValueError:
            port = None
        if not u.hostname or port is None:
            raise ValueError(f"remote url {url!r}: expected lm://host:port")
