"""Downstream eval sets: each has its own curve and fit beside iid validation, survives a restart, and reports its
Spearman correlation with iid validation over the versions both measured (with an interval, or too few points)."""

from __future__ import annotations

import numpy as np
import pytest

from scalerl import errors
from scalerl.v1 import common_pb2
from scalerl_forecaster.correlation import MIN_VERSIONS, spearman
from scalerl_forecaster.fit import sigmoid_curve
from scalerl_forecaster.jobs import Forecasts


def point(job, version, compute, value):
    return common_pb2.ValidationPoint(job_id=job, step=version, policy_version=version, compute=compute, value=value)


def feed(forecasts, job, eval_set, A, C_mid, n=25, seed=0, versions=None):
    rng = np.random.default_rng(seed)
    for v in (range(n + 1) if versions is None else versions):
        c = 2.0 * v
        value = rng.binomial(4000, float(sigmoid_curve(c, A, 1.5, C_mid, 0.2))) / 4000
        forecasts.add_point(point(job, v, c, value), "", eval_set)


def test_each_set_has_its_own_curve_and_fit(tmp_path):
    f = Forecasts(state_dir=tmp_path)
    feed(f, "j", "", A=0.7, C_mid=20.0, seed=1)
    feed(f, "j", "math-hard", A=0.4, C_mid=20.0, seed=2)
    assert f.eval_sets("j") == ["iid", "math-hard"]
    iid, hard = f.forecast("j"), f.forecast("j", "math-hard")
    assert iid.a == pytest.approx(0.7, abs=0.06) and hard.a == pytest.approx(0.4, abs=0.06)
    assert len(f.points("j", "math-hard")) == 26 and f.points("j", "other") == []
    assert iid.HasField("decision") and not hard.HasField("decision")  # advice is about the iid curve
    restarted = Forecasts(state_dir=tmp_path)
    assert restarted.eval_sets("j") == ["iid", "math-hard"]
    assert restarted.forecast("j", "math-hard").a == pytest.approx(hard.a)


def test_a_set_that_tracks_iid_validation_is_correlated(tmp_path):
    f = Forecasts()
    feed(f, "j", "iid", A=0.7, C_mid=20.0, seed=3)
    feed(f, "j", "tracks", A=0.5, C_mid=20.0, seed=4)
    rng = np.random.default_rng(5)
    for v in range(26):  # flat: pure noise around 0.3
        f.add_point(point("j", v, 2.0 * v, float(rng.binomial(4000, 0.3) / 4000)), "", "flat")
    feed(f, "j", "short", A=0.5, C_mid=20.0, seed=6, versions=range(3))
    by_set = {s.eval_set: s for s in f.correlations("j").sets}
    assert set(by_set) == {"tracks", "flat", "short"}
    assert by_set["tracks"].enough_points and by_set["tracks"].spearman > 0.8
    assert by_set["tracks"].interval.lo > 0 and "tracks iid validation" in by_set["tracks"].note
    assert by_set["flat"].interval.lo < 0 < by_set["flat"].interval.hi
    assert not by_set["short"].enough_points and by_set["short"].num_versions == 3
    assert "too few points" in by_set["short"].note


def test_correlations_of_an_unknown_job_and_bad_set_names_are_refused():
    f = Forecasts()
    with pytest.raises(errors.NotFound):
        f.correlations("nope")
    with pytest.raises(errors.InvalidArgument, match="eval_set"):
        f.add_point(point("j", 0, 0.0, 0.2), "", "no spaces!")


def test_spearman_interval_covers_the_truth_about_as_often_as_it_says():
    # rank correlation of a bivariate normal with Pearson r = 0.6: rho_s = 6/pi asin(r/2)
    r = 0.6
    truth = 6 / np.pi * np.arcsin(r / 2)
    rng = np.random.default_rng(0)
    cov = [[1, r], [r, 1]]
    covered = 0
    for _ in range(400):
        xy = rng.multivariate_normal([0, 0], cov, size=20)
        s = spearman(xy[:, 0], xy[:, 1])
        covered += s.interval[0] <= truth <= s.interval[1]
    assert 0.91 <= covered / 400 <= 0.99


def test_spearman_says_too_few_points():
    s = spearman(range(MIN_VERSIONS - 1), range(MIN_VERSIONS - 1))
    assert not s.enough and "too few points" in s.note
    assert spearman([1, 2, 3, 4, 5], [5, 5, 5, 5, 5]).enough is False
    assert spearman([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 6, 5]).rho == pytest.approx(1 - 6 * 2 / (6 * 35))
