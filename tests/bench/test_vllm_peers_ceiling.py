"""``bench.vllm_peers.ceiling``: the best hit any connector can get inside vLLM, per request
(block boundaries, earlier prompt ends and last computed tokens, at most prompt - 1)."""

from __future__ import annotations

import numpy as np
import pytest

from hybrid_connector.bench.vllm_peers import ttft
from hybrid_connector.bench.vllm_peers.ceiling import ceiling, request_hits


def _r(inp: list[int], out: list[int]) -> dict[str, np.ndarray]:
    return {"input_tokens": np.asarray(inp), "output_tokens": np.asarray(out)}


A_IN, A_OUT = list(range(10, 19)), [40, 41]  # 9 prompt tokens, 2 answer tokens


@pytest.mark.parametrize(("prompt", "hit"), [
    (A_IN + A_OUT + [7, 7, 7], 10),   # A's last computed token (10), not its end (11)
    (A_IN + [5, 5, 5], 9),            # A's prompt end, past the block floor (8)
    (A_IN, 8),                        # the same prompt: vLLM computes its last token
    (A_IN[:6] + [5] * 6, 4),          # a shared prefix ending mid-block: the block floor
    ([99] * 12, 0),                   # nothing shared
])
def test_ceiling_hit_is_the_best_position_vllm_can_resume_a_hybrid_model_at(
        prompt: list[int], hit: int) -> None:
    got = request_hits([_r(A_IN, A_OUT), _r(prompt, [1])], block=4)
    assert got == [(9, 0), (len(prompt), hit)]


def test_ceiling_totals_and_ttft_floor() -> None:
    recs = [_r(A_IN, A_OUT), _r(A_IN + A_OUT + [7, 7, 7], [1])]
    model = ttft.for_preset("qwen3.5-4b", 16.5)
    c = ceiling(recs, 4, model)
    assert c["hit_rate"] == pytest.approx(10 / 23) and c["recomputed"] == 13
    want = (model.compute_s(9, 0) + model.compute_s(14, 10)) / 2 + model.overhead_s
    assert c["ttft_ms"] == pytest.approx(1e3 * want)
    with pytest.raises(ValueError):
        request_hits(recs, 0)
