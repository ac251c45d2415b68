"""Prometheus metrics of a server (``prometheus_client``, its own registry): request
counts and latencies by command and reply code, and, on each scrape, what the server
holds by model, tier and kind and its hit rates."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

StatsFn = Callable[[], dict[str, Any]]


class _Held(Collector):
    def __init__(self, stats: StatsFn) -> None:
        self.stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self.stats()
        objects = GaugeMetricFamily("hc_objects", "objects held", labels=["model", "tier", "kind"])
        nbytes = GaugeMetricFamily("hc_bytes", "bytes held", labels=["model", "tier", "kind"])
        rate = GaugeMetricFamily("hc_token_hit_rate", "token hit rate", labels=["model"])
        lookups = GaugeMetricFamily("hc_lookups", "lookups", labels=["model"])
        for fp, model in [*s["models"].items(), *s["plain"]["held"].items()]:
            for tier, kinds in (model.get("held", model) or {}).items():
                for kind, (n, b) in kinds.items():
                    objects.add_metric([fp, tier, kind], n)
                    nbytes.add_metric([fp, tier, kind], b)
            if "token_hit_rate" in model:
                rate.add_metric([fp], model["token_hit_rate"])
                lookups.add_metric([fp], model["lookups"])
        yield from (objects, nbytes, rate, lookups)


class Metrics:
    """The registry ``/metrics`` serves; ``observe`` is the connection handler's hook."""

    def __init__(self, stats: StatsFn) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("hc_requests", "requests by command and reply code",
                                ["command", "code"], registry=self.registry)
        self.latency = Histogram("hc_request_seconds", "time to serve a request",
                                 ["command"], registry=self.registry,
                                 buckets=(1e-4, 1e-3, 5e-3, 0.02, 0.1, 0.5, 2.0, 10.0))
        self.registry.register(_Held(stats))

    def observe(self, command: str, code: int, seconds: float) -> None:
        self.requests.labels(command, str(code)).inc()
        self.latency.labels(command).observe(seconds)
