"""``alpha_grid`` / ``simulate --grid`` restrict the auto tuner's candidates, and a grid the
shadow tuner cannot use is a config error."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybrid_connector.cli import main
from hybrid_connector.core.config import ConfigError, load_config
from hybrid_connector.policies import build
from hybrid_connector.policies.tuning.base import Candidate, TunerRequest
from hybrid_connector.policies.tuning.shadow import ShadowTuner
from hybrid_connector.sim.traces import agentic, save_jsonl

GRID = (0.0, 0.5, 1.0)


class Rising:
    """A twin whose score grows with alpha: the top of any grid leads, so an unrestricted
    tuner would keep doubling past it."""

    def __init__(self, cand: Candidate) -> None:
        self.cand = cand
        self.rng = np.random.default_rng(int(cand.alpha * 100))

    def step(self, request: TunerRequest) -> float:
        bonus = 0.5 if self.cand.score == "product" else 0.0
        return 10.0 + self.cand.alpha + bonus + 0.1 * self.rng.standard_normal()

    def close(self) -> None:
        pass


def _cfg(**over: object):
    return load_config(None, {"eviction": "marconi", **over}, environ={})


def test_alpha_grid_is_the_shadow_tuners_candidates_and_never_left() -> None:
    opts = build.shadow_options(_cfg(alpha_grid=list(GRID)), background=False)
    t = ShadowTuner(Rising, **opts)  # type: ignore[arg-type]
    assert {c.alpha for c in t.offered} <= set(GRID)
    t.start(0)
    for _ in range(300):
        t.record(np.arange(3, 20), 10)
        t.poll()
    assert {c.alpha for c in t.offered} <= set(GRID), [c.label for c in t.offered]
    assert t.current.alpha == max(GRID)
    # without a grid the default one is still extended while its top leads
    free = ShadowTuner(Rising, **build.shadow_options(_cfg(), background=False))  # type: ignore[arg-type]
    free.start(0)
    for _ in range(300):
        free.record(np.arange(3, 20), 10)
    assert max(c.alpha for c in free.offered) > 32


def test_simulate_grid_restricts_the_auto_tuner(tmp_path) -> None:
    trace, out = tmp_path / "agentic.jsonl", tmp_path / "rows.json"
    save_jsonl(agentic(6, 12, 0, sessions_per_second=1.0, side_calls=2.0), trace)
    # unrestricted, auto leaves {0, 1} on this trace (alpha 2 at request 80)
    rc = main(["simulate", "--trace", str(trace), "--size", "0.968GiB", "--grid", "0,1",
               "--json", str(out)])
    assert rc == 0
    row = json.loads(out.read_text())[0]
    assert row["alpha"] in (0.0, 1.0)
    assert all(a in (0.0, 1.0) for _, a in row["alpha_history"]), row["alpha_history"]


@pytest.mark.parametrize(("over", "words"), [
    ({"alpha_grid": [1.0, 2.0]}, "shadow_start"),  # starts at LRU (alpha 0), not in the grid
    ({"alpha_grid": [0.0, 2.0], "shadow_start": 4.0}, "shadow_start"),
    ({"alpha_grid": [0.0, 2.0], "shadow_alphas": [0.0, 8.0]}, "both set"),
])
def test_a_grid_the_shadow_tuner_cannot_use_is_a_config_error(over, words) -> None:
    with pytest.raises(ConfigError, match=words):
        _cfg(**over)


def test_grids_the_tuners_can_use_load() -> None:
    assert _cfg(alpha_grid=[2.0, 4.0], alpha_tuner="window").alpha_grid == (2.0, 4.0)
    assert _cfg(alpha_grid=[2.0, 4.0], shadow_start=2.0).alpha_grid == (2.0, 4.0)
    assert _cfg(alpha_grid=[1.0], alpha=1.0).alpha == 1.0  # a fixed alpha tunes nothing
    opts = build.tuner_options(_cfg(alpha_grid=[0.0, 3.0], alpha_tuner="window"))
    assert opts["grid"] == (0.0, 3.0)


def test_simulate_reports_an_unusable_grid_as_a_bad_argument(tmp_path, capsys) -> None:
    trace = tmp_path / "agentic.jsonl"
    save_jsonl(agentic(2, 2, 0), trace)
    assert main(["simulate", "--trace", str(trace), "--size", "1GiB", "--grid", "1,2"]) == 2
    assert "shadow_start" in capsys.readouterr().err


class SumRising(Rising):
    """The sum score rises with alpha; the product score stays flat and behind."""

    def step(self, request: TunerRequest) -> float:
        rise = self.cand.alpha if self.cand.score == "sum" else 0.0
        return 10.0 + rise + 0.1 * self.rng.standard_normal()


def test_the_default_grid_extends_the_leading_score_family() -> None:
    t = ShadowTuner(SumRising, **build.shadow_options(_cfg(), background=False))  # type: ignore[arg-type]
    t.start(0)
    for _ in range(300):
        t.record(np.arange(3, 20), 10)
    assert Candidate(64.0, False, "sum") in t.offered, [c.label for c in t.offered]
    assert t.current == Candidate(64.0, False, "sum")
