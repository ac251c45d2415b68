"""State page copies: torch fallback against a loop reference, overlap rules."""

from __future__ import annotations

import random

import pytest
import torch

from hybrid_connector import kernels
from hybrid_connector.kernels.state_pages import CHUNK_BYTES, prepare


def _layer_states(slots: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """conv and ssm state views into one buffer with a padded page, as vLLM lays them."""
    g = torch.Generator().manual_seed(seed)
    conv_elems, ssm_elems, pad = 3 * 10, 2 * 4 * 5, 6
    page = conv_elems + ssm_elems + pad
    raw = torch.randn(slots * page, generator=g)
    conv = raw.as_strided((slots, 3, 10), (page, 10, 1))
    ssm = raw.as_strided((slots, 2, 4, 5), (page, 20, 5, 1), conv_elems)
    return conv, ssm


@pytest.mark.parametrize("seed", range(4))
def test_copy_between_slots_matches_loop(seed: int) -> None:
    rng = random.Random(seed)
    conv, ssm = _layer_states(12, seed)
    raw_before = conv.as_strided((conv.untyped_storage().nbytes() // 4,), (1,), 0).clone()
    src = rng.sample(range(6), 3)
    dst = rng.sample(range(6, 12), 3)  # disjoint from src; the largest slot may appear
    want_conv, want_ssm = conv.clone(), ssm.clone()
    for s, d in zip(src, dst, strict=True):
        want_conv[d] = conv[s]
        want_ssm[d] = ssm[s]
    kernels.copy_state_pages([conv, ssm], [conv, ssm], src, dst)
    assert torch.equal(conv, want_conv) and torch.equal(ssm, want_ssm)
    # padding bytes between pages are never written
    raw_after = conv.as_strided((conv.untyped_storage().nbytes() // 4,), (1,), 0)
    page = conv.stride(0)
    pad = torch.cat([raw_after[i * page + 70 : (i + 1) * page] for i in range(12)])
    pad_before = torch.cat([raw_before[i * page + 70 : (i + 1) * page] for i in range(12)])
    assert torch.equal(pad, pad_before)


def test_save_to_staging_and_restore() -> None:
    conv, ssm = _layer_states(8, 1)
    stage_conv, stage_ssm = torch.empty(2, 3, 10), torch.empty(2, 2, 4, 5)
    kernels.copy_state_pages([conv, ssm], [stage_conv, stage_ssm], [7, 2], [0, 1])
    assert torch.equal(stage_conv[0], conv[7]) and torch.equal(stage_ssm[1], ssm[2])
    fresh_conv, fresh_ssm = _layer_states(8, 2)
    kernels.copy_state_pages([stage_conv, stage_ssm], [fresh_conv, fresh_ssm], [0, 1], [3, 4])
    assert torch.equal(fresh_conv[3], conv[7]) and torch.equal(fresh_ssm[4], ssm[2])


def test_duplicate_sources_fan_out() -> None:
    conv, _ = _layer_states(6, 3)
    kernels.copy_state_pages(conv, conv, [0, 0], [4, 5])
    assert torch.equal(conv[4], conv[0]) and torch.equal(conv[5], conv[0])


def test_empty_slot_lists() -> None:
    conv, ssm = _layer_states(4, 0)
    before = conv.clone()
    kernels.copy_state_pages([conv, ssm], [conv, ssm], [], [])
    assert torch.equal(conv, before)


def test_page_table_rows() -> None:
    conv, ssm = _layer_states(5, 0)
    stage = torch.empty(2, 2, 4, 5)
    a = prepare([conv, ssm], [conv, stage], [2, 3], [0, 1])
    assert a.table.tolist() == [
        [conv.data_ptr(), conv.data_ptr(), conv.stride(0) * 4, conv.stride(0) * 4, 120],
        [ssm.data_ptr(), stage.data_ptr(), ssm.stride(0) * 4, 160, 160],
    ]
    assert CHUNK_BYTES % 16 == 0


@pytest.mark.parametrize(
    ("src_slots", "dst_slots", "match"),
    [
        ([0, 1], [2, 2], "repeated"),
        ([0, 1], [1, 2], "overlaps a source page"),
        ([0], [12], "outside the valid range"),
        ([0, 1], [3], "source slots for 1"),
    ],
)
def test_bad_slots_raise(src_slots: list[int], dst_slots: list[int], match: str) -> None:
    conv, ssm = _layer_states(12, 0)
    before = conv.clone()
    with pytest.raises(ValueError, match=match):
        kernels.copy_state_pages([conv, ssm], [conv, ssm], src_slots, dst_slots)
    assert torch.equal(conv, before)


def test_views_sharing_pages_are_rejected() -> None:
    conv, _ = _layer_states(6, 0)
    shifted = conv.as_strided((5, 3, 10), conv.stride(), conv.stride(0))  # shifted[i] is conv[i + 1]
    # pair 0 writes conv[2]; pair 1 reads shifted[1], the same bytes
    with pytest.raises(ValueError, match="overlaps a source page"):
        kernels.copy_state_pages([conv, shifted], [conv, shifted], [0, 1], [2, 4])
    # without the shared page the same views are fine
    kernels.copy_state_pages([conv, shifted], [conv, shifted], [0, 0], [2, 4])
    assert torch.equal(conv[2], conv[0]) and torch.equal(conv[5], conv[1])


def test_mismatched_pairs_raise() -> None:
    conv, ssm = _layer_states(4, 0)
    with pytest.raises(ValueError, match="page shape"):
        kernels.copy_state_pages(conv, ssm, [0], [1])
    with pytest.raises(ValueError, match="matching"):
        kernels.copy_state_pages([conv, ssm], [conv], [0], [1])
    with pytest.raises(ValueError, match="dense"):
        kernels.copy_state_pages(conv.transpose(1, 2), torch.empty(4, 10, 3), [0], [1])
