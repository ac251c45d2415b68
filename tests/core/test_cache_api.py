"""``CacheAPI`` is the one statement of the request verbs: both caches declare it, and each
verb it names has a contract (a docstring) and the same parameters in both."""

from __future__ import annotations

import inspect

from hybrid_connector.remote.client.server_cache import ServerCache
from hybrid_connector.runtime.api import CacheAPI
from hybrid_connector.runtime.cache import HybridCache

VERBS = [n for n, v in vars(CacheAPI).items() if not n.startswith("_")
         and (callable(v) or isinstance(v, property))]


def test_both_caches_declare_the_protocol() -> None:
    assert CacheAPI in HybridCache.__mro__ and CacheAPI in ServerCache.__mro__
    assert {"lookup", "acquire", "load", "save_async", "release", "finish"} <= set(VERBS)


def test_every_verb_has_a_contract_and_one_signature() -> None:
    for name in VERBS:
        proto = vars(CacheAPI)[name]
        assert (proto.__doc__ or "").strip(), f"CacheAPI.{name} states no contract"
        if isinstance(proto, property):
            continue
        want = list(inspect.signature(proto).parameters)
        for cls in (HybridCache, ServerCache):
            impl = vars(cls).get(name)
            assert impl is not None, f"{cls.__name__} does not implement {name}"
            assert list(inspect.signature(impl).parameters) == want, (cls.__name__, name)
