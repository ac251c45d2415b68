"""Python opcodes a KV connector's scheduler side executes, counted at vLLM's connector API
(``vllm_scheduler_cost.py --ops``): a deterministic proxy of its CPU cost per step.

``OpCounter.attach`` wraps, on the scheduler-role connector instance vLLM's ``Scheduler``
holds, every public method of ``KVConnectorBase_V1`` (and ``SupportsHMA``'s
``request_finished_all_groups``) that the connector's class defines or inherits. While the
outermost of those calls runs, ``sys.settrace`` counts every Python opcode executed on the
engine-core thread, in whatever it calls (the connector's own scheduler object, its index,
its policies, ``sortedcontainers``; C code such as numpy's counts nothing). Both connectors
are counted at the same boundary: HybridConnector's facade methods and what they call, and
OffloadingConnector's facade, its ``OffloadingConnectorScheduler`` and the manager that one
calls. Same code and same trace: same count (set ``PYTHONHASHSEED`` to pin the order of
sets of strings, which may move it slightly)."""

from __future__ import annotations

import sys
from collections import Counter
from types import FrameType
from typing import Any

#: what ``KVConnectorBase_V1`` + ``SupportsHMA`` expose that vLLM's scheduler may call
#: (``vllm/v1/core/sched/scheduler.py`` in 0.33.0); classmethods and properties are not
#: wrapped (read once at start, or never on the scheduler side)
API = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
       "update_connector_output", "request_finished", "request_finished_all_groups",
       "register_finished_partial_tail", "get_external_cache_hit_sources",
       "get_loaded_kv_cache_group_ids", "on_new_request", "has_pending_block_frees",
       "has_pending_push_work", "take_events", "get_kv_connector_stats", "reset_cache")


class OpCounter:
    """Opcodes executed inside a connector's API calls: ``total``, ``by_method`` (the
    outermost API method) and ``by_file`` (where they ran, for finding the cost)."""

    def __init__(self) -> None:
        self.total = 0
        self.by_method: Counter[str] = Counter()
        self.by_file: Counter[str] = Counter()
        self._method = ""
        self._depth = 0

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            self.total += 1
            self.by_method[self._method] += 1
            self.by_file[_short(frame.f_code.co_filename)] += 1
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return self._local

    def attach(self, connector: Any) -> list[str]:
        """Wrap ``connector``'s API methods on the instance; the names wrapped."""
        names = [n for n in API if callable(getattr(type(connector), n, None))]
        for name in names:
            setattr(connector, name, self._wrap(name, getattr(connector, name)))
        return names

    def _wrap(self, name: str, fn: Any) -> Any:
        def counted(*a: Any, **k: Any) -> Any:
            if self._depth:
                return fn(*a, **k)
            self._depth = 1
            self._method = name
            sys.settrace(self._global)
            try:
                return fn(*a, **k)
            finally:
                sys.settrace(None)
                self._depth = 0
        return counted


def _short(path: str) -> str:
    for mark in ("hybrid_connector/", "site-packages/"):
        if mark in path:
            return path.split(mark, 1)[1]
    return path
