#!/usr/bin/env python
"""A profile likelihood for the ceiling A under the drift-aware noise model, against the bootstrap's interval.

Issue 15 asked whether a profile likelihood for A would tell an identifiable ceiling from an unidentifiable one
better than the bootstrap.  For each curve this script takes the fit's own noise model (REML white sd, AR(1) drift
sd and coefficient: ``FitResult.noise``) as the covariance V of the window's points, the compute-0 point as an
observation of R0 with white noise, and for every A on a grid minimises the generalised residual sum of squares
over (B, log C_mid, R0).  The 80 % interval is where that profile lies within chi2_1(0.8) = 1.64 of its minimum
(a likelihood-ratio interval; no priors).  ``--drift-inflate`` scales the drift sd as the bootstrap does (REML is
biased low on short windows; the fit uses 1.5).

Reported per family (bench/forecast_bench.py's generator and seeds) and for the real runs fitted on their first
half: how often A's 80 % interval holds the true A (synthetic only: a real run's A is unknown); the median width
of A's interval; the share called identifiable (the fit's own rules with the A-width rule, A interval <= 0.10,
applied to each interval); of those, the share whose forecast is within +-0.02 of the truth (synthetic: the curve
at 2W; real runs: the final value) and the count off by more than 0.03 ("confident wrong").  The point forecast is
the fit's in both columns; only the interval on A, and so the identifiability call, differs.

Usage: python bench/forecast_profile.py [--per-family N] [--seed-base S] [--drift-inflate F]
"""

from __future__ import annotations

import argparse
import math
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
from scipy.stats import chi2  # noqa: E402

import forecast_bench as fb  # noqa: E402
from scalerl_forecaster.fit import MAX_A_WIDTH, _batched_lm, fit_curve  # noqa: E402

GRID = 121
STARTS_U = (0.0, 1.0, 2.5)  # log C_mid starts: the fit's, and one and 2.5 e-folds later


def _whitener(n: int, noise: tuple[float, float, float], inflate: float) -> np.ndarray:
    """L^-1 for the covariance of (R0 observation, window points): white on all, AR(1) drift on the window."""
    sw, sd, phi = noise
    sd *= inflate
    lag = np.abs(np.subtract.outer(np.arange(n), np.arange(n)))
    V = np.zeros((n + 1, n + 1))
    V[0, 0] = sw * sw
    V[1:, 1:] = sw * sw * np.eye(n) + sd * sd * phi ** lag
    V += 1e-12 * np.eye(n + 1)
    return np.linalg.inv(np.linalg.cholesky(V))


def profile_interval(res, c, v, level: float = 0.8, inflate: float = 1.0) -> tuple[float, float]:
    """Likelihood-ratio interval on A for a sigmoid fit ``res`` of the curve (c, v) whose first point is at 0."""
    cf, yf = c[c > 0], v[c > 0]
    x = np.log(cf)
    n = cf.size
    Li = _whitener(n, res.noise, inflate)
    y_full = np.concatenate([[v[0]], yf])
    p = res.params
    a_lo = max(min(float(np.min(yf)), p["A"] - 0.3), 0.0)
    grid = np.linspace(a_lo, 1.0, GRID)
    span = max(x[-1] - x[0], 1e-6)
    lo = np.array([0.05, x[0] - 3.0 - span, 0.0])
    hi = np.array([20.0, x[-1] + 4.0 + span, 1.0])
    A_rows = np.repeat(grid, len(STARTS_U))[:, None]
    th0 = np.array([[p["B"], math.log(p["C_mid"]) + du, p["R0"]] for _ in grid for du in STARTS_U])

    def fj(th, idx):
        A = A_rows[idx]
        B, u, R0 = th[:, 0:1], th[:, 1:2], th[:, 2:3]
        d = x[None, :] - u
        s = 1.0 / (1.0 + np.exp(-np.clip(B * d, -60, 60)))
        g = (A - R0) * s * (1 - s)
        f = np.concatenate([R0, R0 + (A - R0) * s], axis=1)
        J = np.zeros((th.shape[0], n + 1, 3))
        J[:, 0, 2] = 1.0
        J[:, 1:, 0] = g * d
        J[:, 1:, 1] = -g * B
        J[:, 1:, 2] = 1 - s
        return f @ Li.T, np.einsum("mj,kjp->kmp", Li, J)

    yw = np.tile(Li @ y_full, (A_rows.shape[0], 1))
    _, rss = _batched_lm(fj, th0, yw, lo, hi, iters=60)
    excess = rss.reshape(GRID, len(STARTS_U)).min(axis=1)
    excess = excess - excess.min() - chi2.ppf(level, 1)
    inside = np.nonzero(excess <= 0)[0]
    i, j = inside[0], inside[-1]

    def crossing(a, b):  # linear interpolation of where the profile meets the threshold between grid points a, b
        return float(grid[a] + (grid[b] - grid[a]) * excess[a] / (excess[a] - excess[b]))

    return (crossing(i - 1, i) if i > 0 else float(grid[0]),
            crossing(j + 1, j) if j < GRID - 1 else float(grid[-1]))


def identifiable_with(res, a_interval: tuple[float, float]) -> bool:
    """The fit's identifiability rules with ``a_interval`` in place of the bootstrap's interval on A."""
    other_rules = not any(w.startswith(("fitted A sits", "C_mid")) for w in res.warnings)
    return other_rules and a_interval[1] - a_interval[0] <= MAX_A_WIDTH


def _row(label, recs) -> str:
    def stats(key_iv, key_ident):
        ident = [r for r in recs if r[key_ident]]
        cover = np.mean([r[key_iv][0] <= r["A_true"] <= r[key_iv][1] for r in recs]) if "A_true" in recs[0] else np.nan
        width = np.median([r[key_iv][1] - r[key_iv][0] for r in recs])
        within = np.mean([r["err"] <= 0.02 for r in ident]) if ident else float("nan")
        wrong = sum(r["err"] > 0.03 for r in ident)
        return f"{cover:.0%} | {width:.3f} | {len(ident) / len(recs):.0%} | {within:.0%} of {len(ident)} | {wrong}"

    return f"| {label} | {len(recs)} | {stats('A_boot', 'ident_boot')} | {stats('A_prof', 'ident_prof')} |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-family", type=int, default=80)
    ap.add_argument("--seed-base", type=int, default=0)
    ap.add_argument("--drift-inflate", type=float, default=1.0)
    args = ap.parse_args(argv)

    print("| family | n | bootstrap: A covered | width | identifiable | ident. within ±0.02 | confident wrong "
          "| profile: A covered | width | identifiable | ident. within ±0.02 | confident wrong |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for fi, fam in enumerate(fb.FAMILIES):
        recs = []
        for k in range(args.per_family):
            seed = args.seed_base + 1000 * fi + k
            c, y, tr = fb.make_curve(np.random.default_rng(seed), fam)
            res = fit_curve(c, y, level=fb.LEVEL, predict_at=[fb.TARGET], seed=seed)
            iv = profile_interval(res, c, y, fb.LEVEL, args.drift_inflate)
            recs.append(dict(A_true=tr["A"], A_boot=res.intervals["A"], A_prof=iv, ident_boot=res.identifiable,
                             ident_prof=identifiable_with(res, iv), err=abs(res.predictions[0].value - tr["target"])))
        print(_row(fam, recs), flush=True)
    recs = []
    for _name, c, v, c_end, final in fb.real_curves(0.5):
        if c[0] != 0.0:
            continue
        res = fit_curve(c, v, level=fb.LEVEL, predict_at=[c_end], seed=0)
        iv = profile_interval(res, c, v, fb.LEVEL, args.drift_inflate)
        recs.append(dict(A_boot=res.intervals["A"], A_prof=iv, ident_boot=res.identifiable,
                         ident_prof=identifiable_with(res, iv), err=abs(res.predictions[0].value - final)))
    print(_row("real runs, first half (error against the final value)", recs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
