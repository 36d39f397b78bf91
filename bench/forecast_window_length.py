#!/usr/bin/env python
"""CPU time of one sigmoid fit against the number of evaluations in its window.

A GPU run validated every few steps for thousands of steps gives the forecaster thousands of points, and the live
service refits the curve as each one arrives.  The posterior behind the point forecast weighs every cell of its
grid under seven noise shapes (white, or white plus AR(1) drift), which takes the window's points whitened by
each shape's covariance V.  The fit whitens them with the Kalman filter's recursion, O(n) per column
(``_drift_whitener``); "dense" below is the same fit with L^-1 (L the Cholesky factor of V) applied as a dense
matrix, O(n^2) per column and O(n^3) to form, as it was before.  Both give the same fit to round-off (the script
checks the forecast at 2W agrees to 1e-9).

Each curve: the benchmark's drift-hi generator shape (A 0.7, B 1.8, midpoint at half the window, white sd 0.008
plus AR(1) drift sd 0.009 at rho 0.9 along the evaluations), n evaluations evenly spread over (0, W] plus one at
compute 0.  Reported: median CPU time per fit over --reps fits (one BLAS thread), and the ratio.

Usage: python bench/forecast_window_length.py [--lengths 12 48 100 300 1000 3000] [--reps 3] [--dense-max 1000]
An older checkout's fit, side by side: PYTHONPATH=<checkout>/services/forecaster python bench/forecast_window_length.py
(its fit has no O(n) whitening to swap, so only the first column is filled).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402

from scalerl_forecaster import fit as fitmod  # noqa: E402

W = 8000.0


def curve(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    c = np.concatenate([[0.0], np.linspace(W / n, W, n)])
    y = fitmod.sigmoid_curve(c, 0.7, 1.8, W / 2, 0.25) + rng.normal(0, 0.008, c.size)
    d = rng.normal(0, 0.009)
    for i in range(1, c.size):
        y[i] += d
        d = 0.9 * d + rng.normal(0, 0.009 * np.sqrt(1 - 0.81))
    return c, np.clip(y, 0, 1)


def dense_whitener(n, w, phi, first_var):
    L = np.linalg.cholesky(fitmod._drift_cov(n, w, phi, first_var))
    Li = np.linalg.inv(L)

    def whiten(z, out=None):
        res = (Li @ z.reshape(z.shape[0], -1)).reshape(z.shape)
        if out is None:
            return res
        out[...] = res
        return out

    return whiten, 2 * float(np.sum(np.log(np.diag(L))))


def cpu_per_fit(c, y, reps: int) -> tuple[float, float]:
    times, value = [], float("nan")
    for _ in range(reps):
        t = time.process_time()
        res = fitmod.fit_curve(c, y, predict_at=[2 * W])
        times.append(time.process_time() - t)
        value = res.predictions[0].value
    return float(np.median(times)), value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[12, 48, 100, 300, 1000, 3000])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dense-max", type=int, default=1000, help="longest window fitted the dense way too")
    args = ap.parse_args(argv)
    fitmod.fit_curve(*curve(24, 0))  # imports and first-call costs out of the timings
    fast = getattr(fitmod, "_drift_whitener", None)  # None: an older fit (PYTHONPATH=<checkout>/services/forecaster)
    print("| evaluations in the window | CPU per fit | dense L^-1 | dense / this |")
    print("|---|---|---|---|")
    for n in args.lengths:
        c, y = curve(n, n)
        t_fast, v_fast = cpu_per_fit(c, y, args.reps)
        cells = [f"{n}", f"{t_fast * 1e3:.0f} ms", "not run", ""]
        if fast is not None and n <= args.dense_max:
            fitmod._drift_whitener = dense_whitener
            try:
                t_dense, v_dense = cpu_per_fit(c, y, args.reps)
            finally:
                fitmod._drift_whitener = fast
            if abs(v_dense - v_fast) > 1e-9:
                raise SystemExit(f"n={n}: the two whitenings disagree ({v_fast} vs {v_dense})")
            cells[2:] = [f"{t_dense * 1e3:.0f} ms", f"{t_dense / t_fast:.1f}x"]
        print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
