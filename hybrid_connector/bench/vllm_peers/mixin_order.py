"""A KV connector's worker calls around one forward pass, in the order vLLM 0.33's GPU model
runner makes them (``gpu_model_runner`` then ``KVConnectorModelRunnerMixin``): shared by the
head-to-head's runner and the test harness, so both drive a connector exactly as vLLM does.
Model Runner V2 (vLLM's default where Triton is installed) calls ``handle_preemptions``
later, after its Mamba align pre-copy has written the step's running blocks; a connector
that copies a save there would read blocks this order keeps intact, so ours copies every
save in ``wait_for_save`` of the step that decided it (docs/vllm_peers.md)."""

from __future__ import annotations

from typing import Any


def before_forward(conn: Any, so: Any) -> None:
    """Preemptions first, then this step's metadata, then the loads vLLM waits for."""
    conn.handle_preemptions(so.kv_connector_metadata)
    conn.bind_connector_metadata(so.kv_connector_metadata)
    if so.has_sync_kv_loads:
        conn.start_load_kv(None)


def after_forward(conn: Any, so: Any) -> Any:
    """Asynchronous loads, this step's saves, then what finished: the step's
    ``KVConnectorOutput`` (metadata cleared, as the mixin does)."""
    from vllm.v1.outputs import KVConnectorOutput

    if not so.has_sync_kv_loads:
        conn.start_load_kv(None)
    conn.wait_for_save()
    res = conn.get_transfer_results(set(so.finished_req_ids))
    out = KVConnectorOutput(finished_sending=res.finished_sending,
                            finished_recving=res.finished_recving,
                            failed_recving=res.failed_recving,
                            invalid_block_ids=conn.get_block_ids_with_load_errors(),
                            kv_connector_stats=conn.get_kv_connector_stats(),
                            kv_connector_worker_meta=conn.build_connector_worker_meta())
    conn.clear_connector_metadata()
    return out
