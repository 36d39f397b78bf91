"""The compare verdict on synthetic curves from known parameters: a pair differing only in A is a ceiling mover,
only in B or C_mid an efficiency shaper, identical pairs show no difference, and identical pairs are called
different at most about 5 % of the time (the verdict's family-wise level)."""

from __future__ import annotations

import numpy as np
import pytest

from scalerl_forecaster.decisions import compare
from scalerl_forecaster.fit import fit_curve, sigmoid_curve

BASE = dict(C_mid=2542.0, B=1.92, A=0.61, R0=0.3)


def fitted(seed: int, step: float = 150.0, **change):
    p = BASE | change
    rng = np.random.default_rng(seed)
    c = np.concatenate([[0.0], np.arange(step, 20_000 + 1e-9, step)])
    values = rng.binomial(16_000, sigmoid_curve(c, p["A"], p["B"], p["C_mid"], p["R0"])) / 16_000
    return fit_curve(c, values, min_compute=1500, seed=seed)


@pytest.mark.parametrize("seed", [10, 20, 30])
def test_a_pair_differing_only_in_A_is_a_ceiling_mover(seed):
    cmp = compare(fitted(seed), fitted(seed + 1, A=0.66))
    assert cmp.verdict == "ceiling mover", cmp.summary
    assert cmp.higher_ceiling == "b" and cmp.more_efficient is None
    assert cmp.ceiling_p < 0.025


@pytest.mark.parametrize("seed", [10, 20, 30])
def test_a_pair_differing_only_in_B_is_an_efficiency_shaper(seed):
    cmp = compare(fitted(seed), fitted(seed + 1, B=2.6))
    assert cmp.verdict == "efficiency shaper", cmp.summary
    assert cmp.higher_ceiling is None and cmp.more_efficient == "b"
    assert cmp.efficiency_p < 0.025


@pytest.mark.parametrize("seed", [10, 20, 30])
def test_a_pair_differing_only_in_C_mid_is_an_efficiency_shaper(seed):
    cmp = compare(fitted(seed), fitted(seed + 1, C_mid=4000.0))
    assert cmp.verdict == "efficiency shaper", cmp.summary
    assert cmp.more_efficient == "a"  # a reaches its midpoint with less compute


def test_identical_pair_shows_no_difference():
    cmp = compare(fitted(40), fitted(41))
    assert cmp.verdict == "no difference beyond noise", cmp.summary
    assert cmp.higher_ceiling is None and cmp.more_efficient is None


def test_false_positive_rate_on_identical_pairs_is_at_most_the_level():
    # 200 identical pairs (independent noise and bootstrap seeds), coarser spacing to keep the fits quick.
    verdicts = [compare(fitted(1000 + 2 * s, step=300.0), fitted(1001 + 2 * s, step=300.0)).verdict
                for s in range(200)]
    false_positives = sum(v != "no difference beyond noise" for v in verdicts)
    # Measured: 5 of 200 (2.5 %). Three separate per-parameter tests at 95 % (the rule before the joint test)
    # call 13 of these 200 pairs different (6.5 %; 17 of 200 at 150-unit spacing).
    assert false_positives <= 10, verdicts  # at most the nominal 5 %


def test_level_is_checked():
    with pytest.raises(ValueError, match="level"):
        compare(fitted(1), fitted(2), level=1.5)
