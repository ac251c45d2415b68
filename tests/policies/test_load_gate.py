"""The load gate's choice (``policies.admission.load_gate``): the option with the least
modeled load + prefill time, the deeper one on a tie."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hybrid_connector.core.load_gate_config import LoadGate
from hybrid_connector.geometry.presets import get_preset
from hybrid_connector.policies.admission.load_gate import LoadCost, Option, cheapest

QWEN = get_preset("qwen3.5-4b")
FULL = LoadCost(LoadGate(enabled=True), QWEN)
STATE, KVB = QWEN.state_bytes(), QWEN.kv_bytes_per_token()


def test_full_size_break_even_of_a_disk_state_is_hundreds_of_tokens() -> None:
    """Qwen3.5-4B on the default H200 figures: a state from NVMe (6 GB/s + the host hop)
    pays for itself only past ~500-700 recomputed tokens; from host memory past ~100."""
    disk = FULL.load_s({"nvme": STATE})
    host = FULL.load_s({"host": STATE})
    assert disk == pytest.approx(STATE / 6e9 + STATE / 25e9)
    per_token = FULL.compute_s(4000, 5000) / 1000
    assert 500 < disk / per_token < 700
    assert 80 < host / per_token < 160


def test_a_disk_state_a_few_tokens_past_a_host_hit_is_refused_many_past_it_taken() -> None:
    base, prompt = 4000, 8000
    shallow = Option(base, {"host": base * KVB + STATE})
    for extra, taken in ((64, False), (400, False), (2000, True)):
        deep = Option(base + extra, {"host": base * KVB, "nvme": extra * KVB + STATE})
        opts = [deep, shallow, Option(0)]
        assert cheapest(opts, prompt, FULL) == (0 if taken else 1), extra


def test_an_unknown_tier_reads_at_the_slowest_rate_through_host() -> None:
    assert FULL.load_s({"tape": 10**9}) == pytest.approx(1 / 2 + 1 / 25)


def test_a_flat_rate_needs_no_geometry_and_no_rate_without_one_is_an_error() -> None:
    flat = LoadCost(LoadGate(flops_per_token=445e6, prefill_tflops=445.0))
    assert flat.compute_s(10, 1010) == pytest.approx(1e-3)
    # a stand-in token for 16.5 real ones of Qwen3.5-4B: linear in the position, like it
    a, b = QWEN.flops_saved(1, 0).total, QWEN.flops_saved(1, 1).total - QWEN.flops_saved(1, 0).total
    real = LoadCost(LoadGate(flops_per_token=a, flops_per_position=b), None)
    assert real.compute_s(3000, 3500) == pytest.approx(FULL.compute_s(3000, 3500))
    with pytest.raises(ValueError, match="flops_per_token"):
        LoadCost(LoadGate())
    with pytest.raises(ValueError, match="no options"):
        cheapest([], 10, flat)


options = st.lists(st.builds(
    Option, st.integers(0, 5000),
    st.dictionaries(st.sampled_from(["host", "nvme", "remote", "device"]),
                    st.integers(0, 10**9), max_size=3)), min_size=1, max_size=6)


@given(options, st.integers(0, 10000), st.floats(1e6, 1e11), st.floats(0.0, 1e8),
       st.floats(0.5, 5000.0))
def test_the_pick_is_no_slower_than_any_option_and_deepest_among_equals(
        opts: list[Option], extra: int, fpt: float, fpp: float, scale: float) -> None:
    cost = LoadCost(LoadGate(flops_per_token=fpt, flops_per_position=fpp, byte_scale=scale))
    prompt = max(o.tokens for o in opts) + extra
    i = cheapest(opts, prompt, cost)
    t = cost.time_s(opts[i], prompt)
    for o in opts:
        other = cost.time_s(o, prompt)
        assert t <= other
        if other == t:
            assert opts[i].tokens >= o.tokens


@given(st.integers(2, 5000), st.integers(0, 5000), st.integers(0, 10**9))
def test_a_free_deeper_hit_always_wins(p: int, extra: int, nbytes: int) -> None:
    """A deeper hit whose loads cost nothing more than a shallower one's is taken."""
    shallow = Option(p // 2, {"nvme": nbytes})
    deep = Option(p, {"nvme": nbytes})
    assert cheapest([shallow, deep], p + extra, FULL) == 1
