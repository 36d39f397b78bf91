"""Scale-or-stop advice on synthetic curves and one recorded run: each recommendation where the curve says so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scalerl_forecaster.csvio import read_curve
from scalerl_forecaster.decisions import ADVICE_FACTORS, advise, compute_to_identify
from scalerl_forecaster.fit import MAX_A_WIDTH, fit_curve, sigmoid_curve

A, B, C_MID, R0 = 0.61, 1.92, 2542.0, 0.3


def fitted(end: float, seed: int = 0, points: int = 60):
    rng = np.random.default_rng(seed)
    c = np.concatenate([[0.0], np.linspace(end / points, end, points)])
    return fit_curve(c, rng.binomial(16_000, sigmoid_curve(c, A, B, C_MID, R0)) / 16_000, min_compute=0.0)


def test_predicts_at_multiples_of_the_compute_spent():
    r = fitted(4000)
    a = advise(r, 4000)
    assert [p.compute for p in a.predictions] == [f * 4000 for f in ADVICE_FACTORS]
    for p in a.predictions:
        assert p.interval[0] <= p.value <= p.interval[1]
        assert p.value == pytest.approx(float(sigmoid_curve(p.compute, A, B, C_MID, R0)), abs=0.03)


def test_continue_while_much_of_the_gain_is_ahead():
    a = advise(fitted(4000), 4000, target=0.58)
    assert a.recommendation == "continue", a.reason
    assert a.gain_interval[0] > 0.01
    assert a.to_target is not None and a.to_target.compute > 4000


def test_continue_towards_a_target_just_above_the_fitted_ceiling_says_where_the_band_reaches_it():
    # above the fitted A but inside its interval: not a stop; the advice says the fitted curve does not get there
    # and from which compute the band's upper end does
    r = fitted(4000)
    target = r.params["A"] + 0.005
    assert target < r.intervals["A"][1]
    a = advise(r, 4000, target=target)
    assert a.recommendation == "continue", a.reason
    assert a.to_target.compute is None
    assert f"target {target:.3f} not reachable: ceiling below target" in a.reason
    assert "the upper end of the 80% band reaches it at compute" in a.reason
    lo, hi = a.to_target.interval  # the same compute, as a structured interval open above
    assert f"reaches it at compute {lo:.4g}" in a.reason and 4000 < lo and hi == float("inf")


def test_stop_once_the_ceiling_is_reached_within_noise():
    a = advise(fitted(30_000), 30_000)
    assert a.recommendation == "stop", a.reason
    assert "ceiling reached within noise" in a.reason and a.gain_interval[1] < 0.01


def test_stop_when_the_target_is_above_the_whole_ceiling_interval():
    a = advise(fitted(8000), 8000, target=0.75)
    assert a.recommendation == "stop" and "above the ceiling" in a.reason
    assert a.to_target.compute is None
    assert a.to_target.interval is None  # not even the band's upper end gets there
    # the rule reads A's interval, the fitted form's; the band past the window also carries the model discrepancy,
    # which may reach a target just above A's interval far out: a stop with an interval open above
    # (docs/decisions.md)
    near = advise(fitted(8000), 8000, target=0.63)
    assert near.recommendation == "stop" and near.to_target.compute is None
    lo, hi = near.to_target.interval
    assert lo > 8000 and hi == float("inf")


def test_stop_when_the_target_is_reached():
    a = advise(fitted(8000), 8000, target=0.5)
    assert a.recommendation == "stop" and "reached" in a.reason


def test_not_decidable_early_and_says_how_much_more_compute_it_needs():
    r = fitted(1500)  # 60 % of C_mid: the ceiling is an extrapolation
    assert not r.identifiable
    a = advise(r, 1500)
    assert a.recommendation == "not decidable yet", a.reason
    assert a.compute_to_identify is not None and a.compute_to_identify > 1500
    assert f"{a.compute_to_identify:.4g}" in a.reason
    # running that far at the same cadence (the same curve, fresh noise) indeed gives an identifiable fit
    points = int(round(60 * a.compute_to_identify / 1500))
    assert all(fitted(a.compute_to_identify, seed=s, points=points).identifiable for s in (11, 12, 13))


def test_a_sliver_of_the_rise_is_not_decidable():
    r = fitted(150)
    a = advise(r, 150)
    assert a.recommendation == "not decidable yet"
    assert a.compute_to_identify is None or a.compute_to_identify > 150


@pytest.mark.parametrize("spent,target", [(0.0, None), (float("nan"), None), (100.0, 1.5)])
def test_bad_input_is_refused(spent, target):
    with pytest.raises(ValueError):
        advise(fitted(4000), spent, target)


def test_a_ceiling_interval_too_wide_past_the_midpoint_asks_for_more_compute():
    """Session 20's third `make run`: the rise is well inside the window (C_mid ~0.014 of 0.23 device-hours), but
    drift left A's interval 0.11 wide. On such a run (session 19's first, identifiable since session 28 scales the
    noise along the window) the advice said it "should become identifiable at 0.2311 (0 more)": the compute already
    spent."""
    c, v = read_curve(Path(__file__).resolve().parents[3] / "docs/benchmarks/runs/session20/make-run-3.csv")
    r = fit_curve(c, v, min_compute=0.0)
    a_lo, a_hi = r.intervals["A"]
    assert not r.identifiable and a_hi - a_lo > MAX_A_WIDTH
    assert not any("C_mid" in w for w in r.warnings), r.warnings
    a = advise(r, c[-1])
    assert a.recommendation == "not decidable yet"
    assert a.compute_to_identify is not None and a.compute_to_identify > 1.2 * c[-1], a.reason
    assert "A's interval" in a.reason and f"{a.compute_to_identify:.4g}" in a.reason
