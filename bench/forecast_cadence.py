#!/usr/bin/env python
"""Does the forecast stay calibrated when a run is validated often? The same families at 24 to 3000 evaluations.

bench/forecast_bench.py draws 12-48 evaluations per window and its drift is an AR(1) along the evaluations. A GPU run
validated every few steps has thousands, and its drift (the policy's slow wander) is a process along the compute:
evaluated twice as often, it is the same drift seen twice as often, not twice as much independent drift. Here the
drift is an Ornstein-Uhlenbeck process in compute whose correlation from one evaluation to the next is
rho ~ U(0.8, 0.95) at 24 evaluations per window (as in forecast_bench's drift families), so rho ** (24 / n) at n.

Families (forecast_bench's ranges, midpoint early: C_mid ~ U(0.3, 0.8) W; A ~ U(0.5, 0.9), B ~ U(1, 3),
R0 ~ U(0.2, 0.35), W = 8000, one evaluation at compute 0 plus n evenly spread over (0, W]):
    white-lo  white sd ~ U(0.005, 0.010)
    drift-lo  white sd 0.005 + drift sd ~ U(0.002, 0.006)
    drift-hi  white sd ~ U(0.005, 0.010) + drift sd ~ U(0.006, 0.012)
Each curve is fitted on (0, W] and scored at 2W against the noiseless curve. Reported per family and cadence: median
and p90 |error|, coverage of the 80 % interval, its median width, how many are called identifiable, how many of those
are covered and "confident wrong" (identifiable, off by more than 0.03), and the median CPU time per fit.

Usage: python bench/forecast_cadence.py [--per-family 40] [--cadences 24 300 1000 3000] [--families drift-hi ...]
An older checkout's fit, side by side: PYTHONPATH=<checkout>/services/forecaster python bench/forecast_cadence.py
"""

from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402

from scalerl_forecaster.fit import fit_curve, sigmoid_curve  # noqa: E402

W = 8000.0
LEVEL = 0.8
FAMILIES = {
    "white-lo": dict(white=(0.005, 0.010), drift=None),
    "drift-lo": dict(white=(0.005, 0.005), drift=(0.002, 0.006)),
    "drift-hi": dict(white=(0.005, 0.010), drift=(0.006, 0.012)),
}


def curve(family: str, seed: int, n: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(compute, values, truth at 2W): the curve of `seed` (the same for every n) observed at n evaluations."""
    spec = FAMILIES[family]
    rng = np.random.default_rng(seed)
    A, B, R0 = rng.uniform(0.5, 0.9), rng.uniform(1, 3), rng.uniform(0.2, 0.35)
    c_mid = rng.uniform(0.3, 0.8) * W
    white = rng.uniform(*spec["white"])
    drift = rng.uniform(*spec["drift"]) if spec["drift"] else 0.0
    rho_24 = rng.uniform(0.8, 0.95)
    noise = np.random.default_rng([seed, n])
    c = np.concatenate([[0.0], np.linspace(W / n, W, n)])
    y = sigmoid_curve(c, A, B, c_mid, R0) + noise.normal(0, white, c.size)
    if drift:
        phi = rho_24 ** (24 / n)
        d = noise.normal(0, drift)
        for i in range(1, c.size):
            y[i] += d
            d = phi * d + noise.normal(0, drift * math.sqrt(1 - phi * phi))
    return c, np.clip(y, 0, 1), float(sigmoid_curve(np.array([2 * W]), A, B, c_mid, R0)[0])


def score(family: str, n: int, seeds: range) -> str:
    errs, covered, widths, ident, cpu = [], [], [], [], []
    for seed in seeds:
        c, y, truth = curve(family, seed, n)
        t0 = time.process_time()
        fit = fit_curve(c, y, model="sigmoid", level=LEVEL, predict_at=[2 * W])
        cpu.append(time.process_time() - t0)
        (pred,) = fit.predictions
        errs.append(pred.value - truth)
        covered.append(pred.interval[0] <= truth <= pred.interval[1])
        widths.append(pred.interval[1] - pred.interval[0])
        ident.append(fit.identifiable)
    e, cov, idf = np.abs(errs), np.array(covered), np.array(ident)
    wrong = int(np.sum(idf & (e > 0.03)))
    return (f"{family:9s} {n:5d} {np.median(e):7.4f} {np.percentile(e, 90):7.4f} {cov.mean():6.0%} "
            f"{np.median(widths):6.3f} {idf.sum():3d}/{idf.size:<3d} {cov[idf].sum():3d}/{idf.sum():<3d} {wrong:5d} "
            f"{np.median(cpu):6.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-family", type=int, default=40)
    ap.add_argument("--cadences", type=int, nargs="+", default=[24, 300, 1000, 3000])
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--seed-base", type=int, default=0)
    args = ap.parse_args()
    seeds = range(args.seed_base, args.seed_base + args.per_family)
    print("family        n  median     p90  cover  width  identif. covered wrong  CPU/fit")
    for family in args.families:
        for n in args.cadences:
            print(score(family, n, seeds), flush=True)


if __name__ == "__main__":
    main()
