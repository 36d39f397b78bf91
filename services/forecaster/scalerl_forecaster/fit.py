"""Compute -> performance curve fitting (ScaleRL §1).

Models
------
``sigmoid`` (default)
    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B), fitted in the parameters (A, B, log C_mid) by bounded
    least squares.  Starting points come from a profile grid over (log C_mid, B) — for each grid cell the
    model is linear in A (and R0 when R0 is free) and is solved in closed form — and the best few cells
    are refined with ``scipy.optimize.least_squares`` (trf, bounds).  The grid is built relative to the
    fitted window on a log scale, so any compute unit works (device-hours of a tiny model or GPU-hours).
``power``
    R(C) = A - D / C^B (paper A.4), fitted the same way (profile over B, linear in A and D).
``paper``
    The paper's A.5 reference: grid A in {0.450, 0.455, .., 0.800} x C_mid in linspace(100, 40000, 100),
    B fitted per cell by least squares started at B = 1 (what ``curve_fit`` does), least SSE wins.
    Intervals are the paper's fixed +-0.02 margin on A (envelope of the per-A best fits), not calibrated.

The sigmoid is then refitted with weakly informative priors on log B and log C_mid (extra least-squares rows
scaled by the estimated noise sd: no effect on noiseless curves; they keep A from running to 1 when the window
cannot tell B, C_mid and A apart).  Its point estimate is the posterior median of A, B and C_mid under the same
priors, averaged over the midpoint, the efficiency and the noise shape (white, or white plus slow drift), with A
and R0 integrated exactly per grid cell: where the window cannot tell a late midpoint with a high ceiling from an
early one with a lower ceiling, the median weighs both instead of picking one least-squares optimum.  The posterior
keeps one noise size along the window: scaling it by ``_noise_trend`` as well was tried and made the point estimates
on the platform's own runs slightly worse (docs/benchmarks/forecast.md, session 29).

Uncertainty (sigmoid, power) is a parametric bootstrap: residual noise is modelled as white plus AR(1) drift
(estimated by REML; validation noise plus slow drift make neighbouring points correlated), for the sigmoid scaled
point by point where its size changes along the window beyond chance (``_noise_trend``: a run's evaluations agree
more closely once its policy has settled on a plateau than while it learns), R0 is perturbed when
it comes from the single compute-0 point, and every replicate is refitted by a vectorised, warm-started
Levenberg–Marquardt (all replicates at once, with the same priors).  For the sigmoid a backtest inside the
window (fit the first 60 % of the points, predict the last 25 %) widens the intervals when that prediction
misses by more than its own uncertainty.  A fit with intervals costs about 60-100 ms of CPU on 12-48 evaluations
(the slowest of the benchmark's families took 0.08-0.27 s depending on the machine), and grows linearly with the
window's evaluations: about 0.2 s at 300, 0.8 s at 1000, 2 s at 3000 (docs/benchmarks/forecast.md, sessions 28-30).

Past the fit window a sigmoid's predictions also carry a model discrepancy: real curves do not follow the fitted
form exactly once it is extrapolated (ours keep creeping up after an early fit has levelled off), which neither the
bootstrap nor the in-window backtest can see.  It is modelled as a random slope in log compute beyond the window,
sd ``MODEL_DISCREPANCY`` x (A - R0) per e-fold of compute, added to the prediction intervals in quadrature (see
``FitResult.discrepancy_sd``).  The intervals on A, B and C_mid, and so identifiability, do not include it.

scipy is imported lazily (inside the fitting functions); importing this module costs only numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Iterable, Sequence

import numpy as np

from scalerl import errors

__all__ = [
    "CurveError",
    "Prediction",
    "FitResult",
    "fit_curve",
    "sigmoid_curve",
    "power_curve",
    "MODELS",
]

MODELS = ("sigmoid", "power", "paper")

# Bootstrap settings
N_BOOT = 300
LM_ITERS = 25
# Evaluations per least-squares start: 99 % of starts converge within 40.  A start that runs on is crawling along a
# flat valley (a prefix the data fit as a step, B towards its bound) whose cost no longer changes; it cost 0.4 s
LSQ_MAX_NFEV = 100

# Identifiability thresholds
MAX_A_WIDTH = 0.10  # interval on A wider than this -> ceiling not identifiable yet
MIN_GAIN_SEEN = 0.6  # the window must reach 60% of the gain (at C_mid's upper end) to trust A
MAX_CMID_FACTOR = 3.0  # upper interval end of C_mid beyond this x the last fitted compute -> not identifiable
# The forecast starts where the window ends, so the fitted curve must meet the window's last quarter: its mean miss
# there, in sds of that mean under the fit's noise (white over the points, the drift's full sd), beyond this ->
# not identifiable.  A curve that jumps inside the window, which no sigmoid of B <= B_MAX follows, is missed by
# 10-80 sds; the benchmark's 1280 curves (both seed sets) and the platform's recorded runs by at most 3.6, and by at
# most 1.6 where the fit is otherwise identifiable (docs/benchmarks/forecast.md, session 35).  A miss under
# END_MISS_FLOOR (pass rate) never counts: a noiseless curve has no noise sd to scale by.
MAX_END_MISS_SDS = 4.0
END_MISS_FLOOR = 0.01
END_SHARE = 0.25

# Model discrepancy past the fit window (sigmoid): sd of the curve's departure from the fitted sigmoid per e-fold of
# compute beyond the window, as a share of the fitted gain A - R0.  Set in session 23 on the platform's recorded runs
# as they stood (docs/benchmarks/runs/, fitted on the first half and on the first quarter of their compute): the
# smallest value on a 0.005 grid that puts the last value inside the 80 % interval for >= 80 % of the 38 fits called
# identifiable.  `bench/forecast_bench.py --calibrate-discrepancy` recomputes it as runs are added
# (docs/benchmarks/forecast.md, session 23).
MODEL_DISCREPANCY = 0.025


class CurveError(errors.InvalidArgument):
    """Bad input curve: empty, non-monotone compute, values outside [0, 1], too few points, ..."""


class TooFewPoints(CurveError):
    """The fit window holds fewer points than the model's parameters need."""


# ---------------------------------------------------------------------------------------------- models


def _expit(z: np.ndarray) -> np.ndarray:
    """Numerically safe logistic 1 / (1 + exp(-z)) (one ufunc: 0.5 (1 + tanh(z / 2)))."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(z, dtype=float)))


def _logc(compute: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(compute, dtype=float))


def sigmoid_curve(compute, A, B, C_mid, R0):
    """R0 + (A - R0) / (1 + (C_mid / C)^B); broadcasts; equals R0 at C = 0."""
    x = _logc(compute)
    z = np.asarray(B, dtype=float) * (x - np.log(np.asarray(C_mid, dtype=float)))
    z = np.where(np.isneginf(x), -np.inf, z)
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.where(np.isneginf(z), 0.0, 1.0 / (1.0 + np.exp(-np.clip(z, -700, 700))))
    return R0 + (np.asarray(A) - R0) * s


def power_curve(compute, A, B, D):
    """A - D / C^B (power law, paper A.4); -inf at C = 0."""
    x = _logc(compute)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(A) - np.asarray(D) * np.exp(-np.asarray(B) * x)


# ---------------------------------------------------------------------------------------------- results


@dataclass
class Prediction:
    compute: float
    value: float
    interval: tuple[float, float]

    def to_json_dict(self) -> dict:
        return {
            "compute": _num(self.compute),
            "value": _num(self.value),
            "interval": [_num(self.interval[0]), _num(self.interval[1])],
        }


def _num(v):
    v = float(v)
    return v if math.isfinite(v) else None


@dataclass
class FitResult:
    model: str
    params: dict[str, float]  # sigmoid/paper: A, B, C_mid, R0; power: A, B, D, R0
    intervals: dict[str, tuple[float, float]]
    predictions: list[Prediction]
    identifiable: bool
    warnings: list[str]
    level: float
    n_points: int
    fit_window: tuple[float, float] = (float("nan"), float("nan"))
    sigma: float = float("nan")  # residual noise estimate
    rmse: float = float("nan")
    # residual noise model (white sd, AR(1) drift sd, drift coefficient) behind the bootstrap (sigmoid, power), its
    # sizes where the window ends (the sigmoid's noise may shrink or grow along the window: ``_noise_trend``)
    noise: tuple[float, float, float] = (float("nan"), float("nan"), float("nan"))
    # parameter rows (A, B, C_mid|D, R0) from the bootstrap (or, for "paper", the +-0.02 envelope fits)
    samples: np.ndarray | None = field(default=None, repr=False, compare=False)
    data: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)
    # sd of the curve's departure from the fitted form per e-fold of compute past the fit window (0: none)
    discrepancy: float = 0.0

    # -- evaluation --------------------------------------------------------------------------------
    def _curve(self, compute, A, B, third, R0):
        if self.model == "power":
            return power_curve(compute, A, B, third)
        return sigmoid_curve(compute, A, B, third, R0)

    def _third(self) -> str:
        return "D" if self.model == "power" else "C_mid"

    @property
    def window_end(self) -> float | None:
        """The last compute of the fit window, where extrapolation (and the model discrepancy) starts; None when
        the result has no such point (a result built without a window)."""
        end = float(self.fit_window[1])
        return end if math.isfinite(end) and end > 0 else None

    def predict(self, compute) -> np.ndarray:
        """Point prediction(s) of the fitted curve at ``compute``."""
        p = self.params
        c = np.atleast_1d(np.asarray(compute, dtype=float))
        return np.asarray(self._curve(c, p["A"], p["B"], p[self._third()], p["R0"]), dtype=float)

    def predict_samples(self, compute) -> np.ndarray | None:
        """Curve values for every bootstrap replicate: shape (n_samples, len(compute))."""
        if self.samples is None or len(self.samples) == 0:
            return None
        c = np.atleast_1d(np.asarray(compute, dtype=float))[None, :]
        s = self.samples
        return np.asarray(self._curve(c, s[:, 0:1], s[:, 1:2], s[:, 2:3], s[:, 3:4]), dtype=float)

    def discrepancy_sd(self, compute) -> np.ndarray:
        """sd of the model discrepancy at ``compute``: 0 inside the fit window, growing with log compute past it.

        The discrepancy is one random slope in log compute beyond the window, so it is fully correlated across
        ``compute``: the sd of R(c1) - R(c0) is ``discrepancy_sd(c1) - discrepancy_sd(c0)``.
        """
        c = np.atleast_1d(np.asarray(compute, dtype=float))
        end = self.window_end
        if not self.discrepancy > 0 or end is None:
            return np.zeros(c.shape)
        with np.errstate(divide="ignore"):
            return self.discrepancy * np.log(np.maximum(c, end) / end)

    def predict_interval(self, compute, level: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Interval on the curve value (the mean validation score) at ``compute``, with the model discrepancy
        past the fit window added in quadrature to each side of the bootstrap interval."""
        c = np.atleast_1d(np.asarray(compute, dtype=float))
        ys = self.predict_samples(c)
        if ys is None:
            v = self.predict(c)
            return v.copy(), v.copy()
        if self.model == "paper":  # envelope of the +-0.02 fits
            return np.nanmin(ys, axis=0), np.nanmax(ys, axis=0)
        lv = self.level if level is None else level
        q = (1 - lv) / 2
        v = self.predict(c)
        lo, hi = _quantile_interval(ys, v, q)
        extra = NormalDist().inv_cdf(1 - q) * self.discrepancy_sd(c)
        # a pass rate stays in [0, 1]: the widening stops there
        return (np.minimum(lo, np.maximum(v - np.hypot(v - lo, extra), 0.0)),
                np.maximum(hi, np.minimum(v + np.hypot(hi - v, extra), 1.0)))

    def prediction(self, compute: float) -> Prediction:
        lo, hi = self.predict_interval([compute])
        return Prediction(float(compute), float(self.predict([compute])[0]), (float(lo[0]), float(hi[0])))

    def to_json_dict(self) -> dict:
        return {
            "model": self.model,
            "params": {k: _num(v) for k, v in self.params.items()},
            "intervals": {k: [_num(v[0]), _num(v[1])] for k, v in self.intervals.items()},
            "predictions": [p.to_json_dict() for p in self.predictions],
            "identifiable": bool(self.identifiable),
            "warnings": list(self.warnings),
        }


def _quantile_interval(samples: np.ndarray, point: np.ndarray, q: float):
    """Percentile interval of bootstrap replicates, always containing the point estimate."""
    with np.errstate(invalid="ignore"):
        lo = np.nanquantile(samples, q, axis=0)
        hi = np.nanquantile(samples, 1 - q, axis=0)
    return np.minimum(lo, point), np.maximum(hi, point)


# ---------------------------------------------------------------------------------------------- input


def _as_curve(compute, values) -> tuple[np.ndarray, np.ndarray]:
    try:
        c = np.asarray(list(compute) if not isinstance(compute, np.ndarray) else compute, dtype=float)
        v = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=float)
    except (TypeError, ValueError) as e:
        raise CurveError(f"compute and values must be numbers: {e}") from None
    if c.ndim != 1 or v.ndim != 1:
        raise CurveError("compute and values must be 1-D sequences")
    if c.size == 0:
        raise CurveError("empty curve: no points")
    if c.size != v.size:
        raise CurveError(f"compute has {c.size} points but values has {v.size}")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(v))):
        raise CurveError("compute and values must be finite numbers (no NaN/inf)")
    if np.any(c < 0):
        raise CurveError(f"compute must be >= 0 (got {c.min():g})")
    d = np.diff(c)
    if np.any(d <= 0):
        i = int(np.argmax(d <= 0)) + 1
        raise CurveError(
            f"compute must be strictly increasing: point {i} has compute {c[i]:g} after {c[i - 1]:g}"
        )
    bad = (v < 0) | (v > 1)
    if np.any(bad):
        i = int(np.argmax(bad))
        raise CurveError(f"values must be pass rates in [0, 1]: point {i} has value {v[i]:g}")
    return c, v


# ---------------------------------------------------------------------------------------------- batched LM


def _batched_lm(fj, theta0: np.ndarray, y: np.ndarray, lo: np.ndarray, hi: np.ndarray, iters: int = LM_ITERS,
                tol: float = 1e-7):
    """Projected Levenberg–Marquardt for K independent problems at once.

    fj(theta (k,p), idx (k,)) -> (f (k,n), J (k,n,p)) for the replicates ``idx``; y (K,n).
    Returns theta (K,p), sse (K,).  A replicate stops once its accepted step is below ``tol`` (relative)
    or its damping has grown large (no further progress); only active replicates are evaluated.
    """
    th = np.clip(theta0.astype(float).copy(), lo, hi)
    K, p = th.shape
    idx = np.arange(K)
    f, J = fj(th, idx)
    r = y - f
    sse = np.einsum("kn,kn->k", r, r)
    lam = np.full(K, 1e-3)
    eye = np.eye(p)
    active = idx
    for _ in range(iters):
        if active.size == 0:
            break
        Ja, ra = J[active], r[active]
        Jt = Ja.transpose(0, 2, 1)
        JtJ = Jt @ Ja
        Jtr = (Jt @ ra[..., None])[..., 0]
        diag = np.diagonal(JtJ, axis1=1, axis2=2)
        M = JtJ + lam[active][:, None, None] * (diag[:, :, None] * eye + 1e-12 * eye)
        try:
            step = np.linalg.solve(M, Jtr[..., None])[..., 0]
        except np.linalg.LinAlgError:
            step = np.zeros((active.size, p))
            for k in range(active.size):
                step[k] = np.linalg.lstsq(M[k], Jtr[k], rcond=None)[0]
        tha = th[active]
        cand = np.clip(tha + step, lo, hi)
        moved = np.abs(cand - tha).max(axis=1) / (1.0 + np.abs(tha).max(axis=1))
        fc, Jc = fj(cand, active)
        rc = y[active] - fc
        ssec = np.einsum("kn,kn->k", rc, rc)
        ok = np.isfinite(ssec) & (ssec <= sse[active])
        acc = active[ok]
        th[acc], f[acc], J[acc], r[acc], sse[acc] = cand[ok], fc[ok], Jc[ok], rc[ok], ssec[ok]
        la = lam[active]
        lam[active] = np.where(ok, np.maximum(la / 3.0, 1e-9), la * 8.0)
        done = (ok & (moved < tol)) | (~ok & (lam[active] > 1e6))
        active = active[~done]
    return th, sse


def _sim_noise(rng, K: int, n: int, noise: tuple[float, float, float]) -> np.ndarray:
    """K draws of white noise (sd sw) plus a stationary AR(1) drift (sd sd, coefficient phi)."""
    sw, sd, phi = noise
    out = rng.standard_normal((K, n)) * sw
    if sd > 0:
        e = rng.standard_normal((K, n)) * (sd * math.sqrt(1 - phi * phi))
        d = e[:, 0] / math.sqrt(1 - phi * phi)
        out[:, 0] += d
        for i in range(1, n):
            d = phi * d + e[:, i]
            out[:, i] += d
    return out


REML_MAX_POINTS = 60
# The drift is a process along the run's compute, not along its evaluations: a run validated every few steps has
# thousands of evaluations per window, and its drift's correlation from one evaluation to the next is then close to 1.
# So the drift's grids of phi are per evaluation up to REML_MAX_POINTS evaluations per window (every benchmark curve
# and nearly every recorded run), else per 1/REML_MAX_POINTS of the window: phi per evaluation is
# phi ** drift_exponent(n), continuous in n, so a live curve's band does not jump as one more point arrives.


def drift_exponent(n: int) -> float:
    """phi per evaluation = phi of the drift's grids ** this: 1 up to REML_MAX_POINTS evaluations, then
    REML_MAX_POINTS / n."""
    return min(1.0, REML_MAX_POINTS / max(n, 1))


def _ar1_group_cov(m: int, g: int, phi: float) -> np.ndarray:
    """Covariance of consecutive g-point means of a unit-variance AR(1) series (m groups)."""
    if g == 1:
        return phi ** np.abs(np.subtract.outer(np.arange(m), np.arange(m)))
    d = np.arange(1, g)
    var = (g + 2.0 * float(np.sum((g - d) * phi**d))) / g**2
    S = float(np.sum(phi ** np.arange(g)))
    k = np.abs(np.subtract.outer(np.arange(m), np.arange(m)))
    with np.errstate(divide="ignore", over="ignore"):
        C = np.where(k > 0, phi ** np.maximum(k * g - (g - 1), 0) * (S / g) ** 2, var)
    return C


def _noise_model_reml(resid: np.ndarray, X: np.ndarray) -> tuple[float, float, float]:
    """REML estimate of white (sw) + AR(1) drift (sd, phi) residual noise.

    Restricted likelihood with the linearised model's Jacobian ``X`` (n, p) as the fixed-effects design, so
    the part of a slow drift that the fitted curve absorbs is accounted for (moment estimates from the
    residual autocorrelations are badly biased towards "no drift" on short windows).
    V = sigma^2 ((1 - w) I + w R(phi)), R_ij = phi^|i-j|; grid over (w, phi), sigma^2 profiled out.
    Long series are reduced to at most REML_MAX_POINTS consecutive-group means (exact covariance of the
    means), which keeps the cost at a few milliseconds. The grid's phi is per evaluation up to REML_MAX_POINTS, else
    per 1/REML_MAX_POINTS of the window (``drift_exponent``); the phi returned is per original point.
    """
    n, p = X.shape
    if n - p < 4:
        return float(np.sqrt(resid @ resid / max(n - p, 1))), 0.0, 0.0
    g = max(1, math.ceil(n / REML_MAX_POINTS))
    m = n // g
    if g > 1:
        off = n - m * g  # drop the earliest leftover points
        r = resid[off:].reshape(m, g).mean(axis=1)
        Xg = X[off:].reshape(m, g, p).mean(axis=1)
    else:
        r, Xg = resid, X
    if m - p < 4:
        return float(np.sqrt(resid @ resid / max(n - p, 1))), 0.0, 0.0
    Xs = Xg / np.maximum(np.linalg.norm(Xg, axis=0), 1e-300)
    phis = tuple(ph ** drift_exponent(n) for ph in (0.3, 0.5, 0.7, 0.8, 0.87, 0.92, 0.95, 0.97))
    ws = (0.15, 0.3, 0.45, 0.6, 0.75, 0.9)
    Cs = {ph: _ar1_group_cov(m, g, ph) for ph in phis}
    Vs = [np.eye(m) / g]
    pars = [(0.0, 0.0)]
    for ph in phis:
        for w in ws:
            Vs.append((1 - w) * np.eye(m) / g + w * Cs[ph])
            pars.append((w, ph))
    V = np.stack(Vs)  # (k, m, m)
    try:
        L = np.linalg.cholesky(V)
    except np.linalg.LinAlgError:
        return float(np.sqrt(resid @ resid / (n - p))), 0.0, 0.0
    rhs = np.concatenate([np.broadcast_to(r[:, None], (m, 1)), Xs], axis=1)
    sol = np.linalg.solve(L, np.broadcast_to(rhs, (len(Vs), m, p + 1)))
    Li_r, Li_X = sol[:, :, 0], sol[:, :, 1:]
    XtVX = Li_X.transpose(0, 2, 1) @ Li_X
    XtVX = XtVX + 1e-9 * np.eye(p) * np.maximum(np.trace(XtVX, axis1=1, axis2=2), 1e-300)[:, None, None]
    XtVr = np.einsum("kmp,km->kp", Li_X, Li_r)
    cX = np.linalg.cholesky(XtVX)
    z = np.linalg.solve(cX, XtVr[..., None])[..., 0]
    q = np.einsum("km,km->k", Li_r, Li_r) - np.einsum("kp,kp->k", z, z)
    q = np.maximum(q, 1e-300)
    s2 = q / (m - p)
    logdetV = 2 * np.sum(np.log(np.diagonal(L, axis1=1, axis2=2)), axis=1)
    logdetX = 2 * np.sum(np.log(np.diagonal(cX, axis1=1, axis2=2)), axis=1)
    m2l = (m - p) * np.log(s2) + logdetV + logdetX
    k = int(np.argmin(m2l))
    w, ph = pars[k]
    return math.sqrt(s2[k] * (1 - w)), math.sqrt(s2[k] * w), float(ph)


PRIOR_DRIFT_WEIGHT = 1.0
# the REML drift sd is biased low on short windows (the fitted curve absorbs part of the drift): the bootstrap
# simulates a drift this much larger (calibrated on development seeds of bench/forecast_bench.py)
DRIFT_BOOT_INFLATE = 1.5


# Validation noise is not the same along a run: while the policy learns, its pass rate moves from one evaluation to
# the next; once it has settled on a plateau, repeated evaluations agree far more closely.  The residuals' first
# differences (which leave out the slow drift) are split into NOISE_BLOCKS consecutive blocks; when their mean
# squares differ beyond chance (Bartlett's test at NOISE_TREND_P), the noise is scaled point by point by the blocks'
# rms, interpolated in log between the blocks' centres.  Otherwise the noise stays the same everywhere.
NOISE_BLOCKS = 3
NOISE_TREND_P = 0.01
NOISE_TREND_MIN_POINTS = 15
# The scale's range is bounded (an sd ratio of 10 between blocks): an evaluator that scores a settled policy exactly
# the same every time would otherwise give its plateau no noise at all.
NOISE_TREND_MAX_RATIO = 10.0


def _noise_trend(resid: np.ndarray) -> np.ndarray:
    """Per-point scale of the residual noise (geometric mean 1); ones when its size does not change along the
    window beyond chance."""
    n = resid.size
    if NOISE_TREND_P <= 0 or n < NOISE_TREND_MIN_POINTS:
        return np.ones(n)
    from scipy.special import chdtrc

    d = np.diff(resid)
    blocks = np.array_split(d, NOISE_BLOCKS)
    m = np.array([b.size for b in blocks], dtype=float)
    v = np.array([float(b @ b) for b in blocks]) / m
    if not v.max() > 0:
        return np.ones(n)
    v = np.maximum(v, v.max() / NOISE_TREND_MAX_RATIO**2)
    # Bartlett's test of equal variances, each block's mean square on m degrees of freedom
    N, k = m.sum(), len(blocks)
    pooled = float(m @ v) / N
    stat = (N * math.log(pooled) - float(m @ np.log(v))) / (1 + (np.sum(1 / m) - 1 / N) / (3 * (k - 1)))
    if chdtrc(k - 1, stat) >= NOISE_TREND_P:
        return np.ones(n)
    centres = np.cumsum(m) - m / 2  # in point positions: difference j lies between points j and j + 1
    log_sd = np.interp(np.arange(n), centres, 0.5 * np.log(v))
    return np.exp(log_sd - log_sd.mean())


def _prior_scale(noise: tuple[float, float, float]) -> float:
    """Noise sd that scales the prior rows: white plus (weighted) drift sd."""
    sw, sd, _ = noise
    return math.hypot(sw, PRIOR_DRIFT_WEIGHT * sd)


# ---------------------------------------------------------------------------------------------- sigmoid


def _sig_fj_factory(x: np.ndarray, r0_rows: np.ndarray | None, free_r0: bool):
    """Model f and Jacobian in theta = (A, B, u=log C_mid[, R0]) for batches.

    ``r0_rows`` (K,1) holds the fixed R0 of every replicate when R0 is not a parameter.
    """
    p = 4 if free_r0 else 3

    def fj(th, idx=None):
        A = th[:, 0:1]
        B = th[:, 1:2]
        u = th[:, 2:3]
        if free_r0:
            R0 = th[:, 3:4]
        else:
            R0 = r0_rows if idx is None or r0_rows.shape[0] == 1 else r0_rows[idx]
        d = x[None, :] - u
        s = _expit(B * d)
        span = A - R0
        f = R0 + span * s
        g = span * s * (1 - s)
        J = np.empty(s.shape + (p,))
        J[..., 0] = s
        J[..., 1] = g * d
        J[..., 2] = -g * B
        if free_r0:
            J[..., 3] = 1 - s
        return f, J

    return fj


# Weakly informative priors (sigmoid): log B ~ N(log B_PRIOR, B_PRIOR_SD^2), with a heavier tail above B 3.4
# (B_PRIOR_TAIL), and log C_mid ~ N(log(end of the fit window), CMID_PRIOR_SD^2).  They enter as extra least-squares
# rows scaled by the noise sd, so they vanish on noiseless curves and only matter where the data cannot tell B,
# C_mid and A apart (midpoint near or beyond the window's end, where a flat prior lets A run to 1).  The B prior
# weighs two populations equally: the paper's Table 1 (B 1.09-2.44, geometric mean 1.84, sd of log B 0.21) and the
# whole-run fits of this platform's own runs (docs/benchmarks/runs: B 0.52-1.23 on the tiny model, 3.9 on SmolLM2;
# over the 24, geometric mean 0.86 and sd of log B 0.37), i.e. about 80 % of its mass on B in [0.66, 2.4].  The
# earlier N(log 1.8, 0.4^2) put our own curves two sd out: it read their slow late rise as a plateau
# (docs/benchmarks/forecast.md, session 11).
B_PRIOR = 1.25
B_PRIOR_SD = 0.5
# More than B_PRIOR_TAIL sds of log B above its mean (B > 1.25 e^1 = 3.4) the B prior's density falls as z^-4 (z
# those sds), not as a Gaussian: a rise steeper than the prior's range that the window shows (a task learnt at
# once) is followed, instead of being bent into a slow curve plus drift.  At B 20 the Gaussian cost 15 nats, which
# outweighed the data (docs/benchmarks/forecast.md, session 36).  Below the seam nothing changes.
B_PRIOR_TAIL = 2.0
CMID_PRIOR_SD = 1.0
# The steepest sigmoid any part of the fit considers (least squares, bootstrap, posterior): from 12 % to 88 % of
# the gain within 0.2 e-folds of compute.  The data decide where B lies above the prior's range; a bound the
# posterior alone kept lower (8) bent such curves into slower ones still rising past the window
# (docs/benchmarks/forecast.md, session 35).
B_MAX = 20.0


def _log_b_penalty(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """-log prior of log B in sds z from its mean (up to a constant), and its derivative: z^2 / 2, with a power-law
    tail above ``B_PRIOR_TAIL`` (value and slope continuous there)."""
    t = B_PRIOR_TAIL
    zt = np.maximum(z, t)
    tail = z > t
    pen = np.where(tail, 0.5 * t * t + t * t * np.log(zt / t), 0.5 * z * z)
    return pen, np.where(tail, t * t / zt, z)


def _prior_rows(th: np.ndarray, prior) -> tuple[np.ndarray, np.ndarray]:
    """Prior "residual model" rows for theta batches (k, p): f (k, 2), J (k, 2, p).  A row's square over twice
    the noise variance is the -log prior, so the B row is sign(z) sqrt(2 penalty(z)) in noise sds."""
    scale, mu_b, s_b, mu_u, s_u = prior
    k, p = th.shape
    B = np.maximum(th[:, 1], 1e-12)
    z = (np.log(B) - mu_b) / s_b
    pen, dpen = _log_b_penalty(z)
    root = np.sqrt(2.0 * pen)
    f = np.stack([scale * np.where(z > B_PRIOR_TAIL, root, z), scale * (th[:, 2] - mu_u) / s_u], axis=1)
    J = np.zeros((k, 2, p))
    # d row / d z: 1 on the Gaussian part (the row is z there), dpen / root on the tail
    J[:, 0, 1] = scale * np.where(z > B_PRIOR_TAIL, dpen / np.maximum(root, 1e-300), 1.0) / (s_b * B)
    J[:, 1, 2] = scale / s_u
    return f, J


def _with_prior(fj, prior):
    """Wrap a batched model so the prior rows are appended (their target is 0)."""
    if prior is None:
        return fj

    def fj2(th, idx=None):
        f, J = fj(th, idx)
        pf, pJ = _prior_rows(th, prior)
        return np.concatenate([f, pf], axis=1), np.concatenate([J, pJ], axis=1)

    return fj2


def _fit_sigmoid(x: np.ndarray, y: np.ndarray, r0: float | None, prior=None, start=None):
    """Returns theta (A, B, u, R0), sse (data part only), bounds.

    ``prior`` (scale, mu_logB, sd_logB, mu_u, sd_u) adds the prior rows; ``start`` (theta) skips the grid search.
    """
    from scipy.optimize import least_squares

    free = r0 is None
    xlo, xhi = float(x.min()), float(x.max())
    span = max(xhi - xlo, 1e-6)
    u_lo, u_hi = xlo - 3.0 - span, xhi + 4.0 + span
    b_lo, b_hi = 0.05, B_MAX
    # --- profile grid over (u, B), linear in A (and R0)
    us = np.linspace(xlo - 2.0, xhi + 3.0, 48)
    Bs = np.geomspace(0.25, 10.0, 28)
    S = _expit(Bs[None, :, None] * (x[None, None, :] - us[:, None, None]))  # (nu, nB, n)
    if not free:
        yy = y - r0
        den = np.einsum("abn,abn->ab", S, S) + 1e-300
        a = np.einsum("abn,n->ab", S, yy) / den
        Agrid = np.clip(r0 + a, 0.0, 1.0)
        pred = r0 + (Agrid - r0)[..., None] * S
        R0grid = np.full_like(Agrid, r0)
    else:
        # y = R0 (1 - S) + A S: 2x2 normal equations per cell
        T = 1 - S
        sTT = np.einsum("abn,abn->ab", T, T)
        sSS = np.einsum("abn,abn->ab", S, S)
        sTS = np.einsum("abn,abn->ab", T, S)
        sTy = np.einsum("abn,n->ab", T, y)
        sSy = np.einsum("abn,n->ab", S, y)
        det = sTT * sSS - sTS**2
        det = np.where(np.abs(det) < 1e-300, 1e-300, det)
        R0grid = np.clip((sSS * sTy - sTS * sSy) / det, 0.0, 1.0)
        Agrid = np.clip((sTT * sSy - sTS * sTy) / det, 0.0, 1.0)
        pred = R0grid[..., None] * T + Agrid[..., None] * S
    sse = np.einsum("abn,abn->ab", y - pred, y - pred)
    if prior is not None:
        sc, mu_b, s_b, mu_u, s_u = prior
        sse = sse + sc**2 * (((np.log(Bs)[None, :] - mu_b) / s_b) ** 2 + ((us[:, None] - mu_u) / s_u) ** 2)
    order = np.argsort(sse, axis=None)
    starts = []
    for flat in order:
        i, j = np.unravel_index(flat, sse.shape)
        cand = (i, j)
        if all(abs(i - a) > 3 or abs(j - b) > 3 for a, b in starts):
            starts.append(cand)
        if len(starts) >= 4:
            break

    lo = [0.0, b_lo, u_lo] + ([0.0] if free else [])
    hi = [1.0, b_hi, u_hi] + ([1.0] if free else [])
    r0_rows = None if free else np.array([[r0]])
    fj = _with_prior(_sig_fj_factory(x, r0_rows, free), prior)
    yy = y if prior is None else np.concatenate([y, [0.0, 0.0]])

    def res(th):
        f, _ = fj(th[None, :])
        return f[0] - yy

    def jac(th):
        _, J = fj(th[None, :])
        return J[0]

    best = None
    th0s = [[float(Agrid[i, j]), float(Bs[j]), float(us[i])] + ([float(R0grid[i, j])] if free else [])
            for i, j in starts]
    if start is not None:
        th0s = [list(start[: len(lo)])] + th0s[:1]
    for th0 in th0s:
        th0 = np.clip(np.array(th0), np.array(lo) + 1e-9, np.array(hi) - 1e-9)
        sol = least_squares(res, th0, jac=jac, bounds=(lo, hi), method="trf", x_scale="jac",
                            ftol=1e-12, xtol=1e-12, gtol=1e-12, max_nfev=LSQ_MAX_NFEV)
        c = float(2 * sol.cost)
        if best is None or c < best[1]:
            best = (sol.x.copy(), c)
    th, c = best
    if prior is not None:
        c -= float(np.sum(_prior_rows(th[None, :], prior)[0] ** 2))
    if not free:
        th = np.append(th, r0)
    return th, c, (np.array(lo), np.array(hi))


# ---------------------------------------------------------------------------------------------- posterior

# Noise shapes the posterior averages over: V = (1 - w) I + w R(phi), R_ij = phi^|i-j| (share w of the variance is
# slow drift; phi per evaluation, or per 1/60 of a longer window: ``drift_exponent``), the overall scale integrated
# out.  Half the prior mass on pure white noise.
POSTERIOR_SHAPES = ((0.0, 0.0),) + tuple((w, phi) for phi in (0.85, 0.95) for w in (0.3, 0.6, 0.85))
POSTERIOR_P_WHITE = 0.5
POSTERIOR_GRID = (48, 32)  # (log C_mid, log B) cells, laid out twice: over the prior's range, then zoomed
POSTERIOR_B_RANGE = (0.3, B_MAX)
# The point estimate is the median of these draws.  300 left it a Monte Carlo error: the same data fitted with another
# seed moved the prediction at 2x the window by up to 0.03 (sd up to 0.011) where the midpoint lies near the window's
# end.  20000 leave it about 0.001, for ~10 ms of a fit's ~120 (docs/benchmarks/forecast.md, session 33)
POSTERIOR_DRAWS = 20000
POSTERIOR_ZOOM_TAILS = (5e-4, 5e-3, 2e-2)  # mass left out of each zoom, both sides
# A fixed R0 (passed by the caller) enters as an observation of R0 with this relative variance: known, in effect
FIXED_R0_VARIANCE = 1e-10


def _drift_cov(n: int, w: float, phi: float, first_var: float | None) -> np.ndarray:
    """The covariance that ``_drift_whitener`` whitens, as a dense matrix: (1 - w) I + w R(phi) on the n window
    points, led (unless ``first_var`` is None) by one independent row of variance ``first_var``.  The fit never forms
    it; tests and bench/forecast_window_length.py check the whitener against its Cholesky factor."""
    lead = first_var is not None
    V = np.zeros((n + lead, n + lead))
    V[lead:, lead:] = (1 - w) * np.eye(n) + (w * _ar1_group_cov(n, 1, phi) if w else 0.0)
    if lead:
        V[0, 0] = first_var
    return V


def _drift_whitener(n: int, w: float, phi: float, first_var: float | None):
    """Whitening of the covariance V = (1 - w) I + w R(phi), R_ij = phi^|i-j|, of n window points, led (unless
    ``first_var`` is None) by one independent row of variance ``first_var`` (the R0 observation): returns the map
    z -> L^-1 z, L the Cholesky factor of V, on arrays of shape (rows, ...), and log |V|.

    White noise plus a stationary AR(1) drift is a state-space model, and L^-1 z are its Kalman filter's normalised
    innovations e_t / sqrt(F_t).  They obey e_t = z_t - phi z_{t-1} + phi (1 - K_{t-1}) e_{t-1}, with the gain K_t
    and the innovation variance F_t from the filter's scalar recursion, which does not depend on the data: O(n) per
    column, where a dense L^-1 costs O(n^2) (a window of 1000 evaluations took seconds).
    """
    lead = 0 if first_var is None else 1
    log_var = np.zeros(n + lead)
    if lead:
        log_var[0] = math.log(first_var)
    a = np.zeros(n)
    if w > 0:
        F = np.empty(n)
        P, r, q = w, 1.0 - w, w * (1.0 - phi * phi)  # P: the drift's variance given the points before
        for t in range(n):
            F[t] = P + r
            a[t] = phi * r / F[t]  # phi (1 - K_t)
            P_next = phi * phi * P * r / F[t] + q
            # the filter's steady state: within 80 points at phi <= 0.95, a few hundred at phi near 1 (long windows)
            if abs(P_next - P) <= 1e-15 * P:
                F[t + 1:], a[t + 1:] = P_next + r, phi * r / (P_next + r)
                break
            P = P_next
        log_var[lead:] = np.log(F)
    inv_sd = np.exp(-0.5 * log_var)

    gains = a.tolist()

    def whiten(z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """L^-1 z, into ``out`` when given (an array of z's shape: the posterior whitens the same design for
        every shape, and a fresh array per call costs more than the recursion on short windows)."""
        z = np.asarray(z, dtype=float)
        if out is None:
            out = z.copy()
        else:
            np.copyto(out, z)
        if w > 0:
            e, zs = out[lead:], z[lead:]
            row = np.empty(e.shape[1:])
            for t in range(1, n):  # e_t = z_t - phi z_{t-1} + a_{t-1} e_{t-1}, one row at a time without temporaries
                np.multiply(e[t - 1], gains[t - 1], out=row)
                e[t] += row
                np.multiply(zs[t - 1], phi, out=row)
                e[t] -= row
        out *= inv_sd.reshape((-1,) + (1,) * (out.ndim - 1))
        return out

    return whiten, float(log_var.sum())


def _posterior_evidence(x, y, r0_row, us, lbs, whiteners, log_prior_shape, prior):
    """Log posterior (up to a constant) and the conditional linear solution on a (log C_mid, log B) grid.

    Given (C_mid, B) the curve is linear in (R0, A): y = R0 (1 - s) + A s.  With a flat prior on (R0, A) inside
    [0, 1]^2 and p(sigma) ~ 1 / sigma, the marginal likelihood of a cell under the noise shape V is
    |V|^-1/2 |X' V^-1 X|^-1/2 S^-(m-2)/2 P(A in [0, 1] | cell), S the generalised residual sum of squares.
    Returns an array (n_shapes, 7, n_cells): log posterior, (R0, A) solution, (X' V^-1 X)^-1 entries (00, 01, 11), S.
    """
    _, mu_b, s_b, mu_u, s_u = prior
    from scipy.special import stdtr

    n = x.size
    m = n + (r0_row is not None)
    s = _expit(np.exp(lbs)[None, :, None] * (x[None, None, :] - us[:, None, None])).reshape(-1, n)
    cells = s.shape[0]
    # both columns are whitened: the forms of 1 - s cannot be had from those of s and of a column of ones, as
    # they cancel to round-off where s is near 1 at every point (a midpoint long before the window)
    X = np.zeros((m, 2, cells))  # rows, (R0, A) columns, cells: each whitening step works on one contiguous row
    X[m - n:, 1] = s.T
    X[m - n:, 0] = 1 - X[m - n:, 1]
    yy = y
    if r0_row is not None:
        X[0, 0] = 1.0
        yy = np.concatenate([[r0_row], y])
    log_prior = -0.5 * ((us[:, None] - mu_u) / s_u) ** 2 - _log_b_penalty((lbs[None, :] - mu_b) / s_b)[0]
    log_prior = log_prior.reshape(cells)
    dof = m - 2
    out = np.empty((len(whiteners), 7, cells))
    Xw = np.empty_like(X)
    for k, ((whiten, logdet_v), lp_shape) in enumerate(zip(whiteners, log_prior_shape)):
        whiten(X, out=Xw)
        yw = whiten(yy)
        m00 = np.einsum("ig,ig->g", Xw[:, 0], Xw[:, 0])
        m11 = np.einsum("ig,ig->g", Xw[:, 1], Xw[:, 1])
        m01 = np.einsum("ig,ig->g", Xw[:, 0], Xw[:, 1])
        b0, b1 = yw @ Xw[:, 0], yw @ Xw[:, 1]
        # a cell whose curve is 0 at every point (a midpoint far past the window, or a steep curve) leaves A
        # undetermined, and one 0 or 1 at every point leaves (R0, A) collinear when R0 is free: the cell explains
        # nothing the others do not, and its arithmetic is not finite
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            det = np.maximum(m00 * m11 - m01**2, 1e-300)
            i00, i01, i11 = m11 / det, -m01 / det, m00 / det
            r0, a = i00 * b0 + i01 * b1, i01 * b0 + i11 * b1
            S = np.maximum(yw @ yw - (b0 * r0 + b1 * a), 1e-300)
            sd_a = np.sqrt(S / dof * i11)
            p_in = stdtr(dof, (1 - a) / sd_a) - stdtr(dof, -a / sd_a)
            lp = (-0.5 * logdet_v - 0.5 * np.log(det) - 0.5 * dof * np.log(S) + log_prior
                  + np.log(np.maximum(p_in, 1e-300)) + lp_shape)
        lp = np.where(np.isfinite(lp), lp, -np.inf)
        out[k] = (lp, r0, a, i00, i01, i11, S)
    return out


def _resolves(mass: np.ndarray, cells: int = 3) -> bool:
    """Whether the posterior's interquartile range spans at least ``cells`` grid cells in log C_mid and in log B."""
    def iqr_cells(marginal):
        cdf = np.cumsum(marginal)
        return np.searchsorted(cdf, 0.75) - np.searchsorted(cdf, 0.25)

    return bool(iqr_cells(mass.sum(axis=1)) >= cells and iqr_cells(mass.sum(axis=0)) >= cells)


def _central_cells(marginal: np.ndarray, tail: float = 5e-4) -> tuple[int, int]:
    """First and last cell of a marginal's central 1 - 2 * tail mass."""
    cdf = np.cumsum(marginal)
    return int(np.searchsorted(cdf, tail)), int(min(np.searchsorted(cdf, 1 - tail), cdf.size - 1))


def _sigmoid_posterior(x, y, r0_obs, r0_fixed, prior, rng, n_draws=POSTERIOR_DRAWS) -> tuple[np.ndarray, bool]:
    """Draws (A, B, C_mid, R0) from the Bayesian posterior of the sigmoid, and whether the grid resolves it.

    Model averaging over the midpoint, the efficiency and the noise shape (white, or white plus slow drift) with
    the same weak priors on log B and log C_mid as the fit; the ceiling A and R0 are integrated exactly per cell
    (Student t).  Where the window cannot tell a late midpoint with a high ceiling from an early one with a low
    ceiling, both stay in the posterior instead of one least-squares optimum being picked; its median is the
    point forecast.  ``r0_obs`` is the compute-0 evaluation (an observation of R0 with white noise only),
    ``r0_fixed`` an R0 given by the caller; with neither R0 is free.  A posterior narrower than a few cells of the
    zoomed grid (a nearly noiseless curve) is not resolved: its median is only as exact as the grid.  ~40 ms at 40
    points, linear in the points (``_drift_whitener``).
    """
    n = x.size
    r0_row = r0_fixed if r0_fixed is not None else r0_obs
    m = n + (r0_row is not None)
    whiteners, lp_shapes = [], []
    p_drift = (1 - POSTERIOR_P_WHITE) / (len(POSTERIOR_SHAPES) - 1)
    per_evaluation = drift_exponent(n)
    for w, phi in POSTERIOR_SHAPES:
        first_var = None if r0_row is None else FIXED_R0_VARIANCE if r0_fixed is not None else 1 - w
        whiteners.append(_drift_whitener(n, w, phi ** per_evaluation, first_var))
        lp_shapes.append(math.log(POSTERIOR_P_WHITE if w == 0 else p_drift))
    nu, nb = POSTERIOR_GRID
    x_lo, x_hi = float(x[0]), float(x[-1])
    us = np.linspace(min(x_lo - 1.0, x_hi - 4.0), x_hi + 4.5, nu)
    lb_lo, lb_hi = np.log(POSTERIOR_B_RANGE)
    lbs = np.linspace(lb_lo, lb_hi, nb)
    ev = _posterior_evidence(x, y, r0_row, us, lbs, whiteners, lp_shapes, prior)
    # zoom: lay the grid again over the cells that hold the mass, so a sharp posterior is not one cell wide; a long
    # tail (a second, late-midpoint explanation) can leave the core a few cells wide: zoom again on less of the tail
    for tail in POSTERIOR_ZOOM_TAILS:
        mass = np.exp(ev[:, 0] - ev[:, 0].max()).sum(axis=0).reshape(nu, nb)
        mass /= mass.sum()
        if tail != POSTERIOR_ZOOM_TAILS[0] and _resolves(mass):
            break
        iu, ib = _central_cells(mass.sum(axis=1), tail), _central_cells(mass.sum(axis=0), tail)
        du, db = us[1] - us[0], lbs[1] - lbs[0]
        us = np.linspace(us[iu[0]] - du, us[iu[1]] + du, nu)
        lbs = np.linspace(lbs[ib[0]] - db, min(lbs[ib[1]] + db, lb_hi), nb)  # never steeper than B_MAX
        ev = _posterior_evidence(x, y, r0_row, us, lbs, whiteners, lp_shapes, prior)
    lp = ev[:, 0]
    wts = np.exp(lp - lp.max()).ravel()
    pick = rng.choice(wts.size, size=n_draws, p=wts / wts.sum())
    shape, cell = np.divmod(pick, lp.shape[1])
    _, r0c, ac, i00, i01, i11, S = ev[shape, :, cell].T
    dof = m - 2
    scale = S / dof
    # a window with no spread at all (an eval set still at 0 everywhere) leaves S, so the scale, at its floor: the
    # factor is 0 / 0 there, and those draws fall back to the cell's solution below
    with np.errstate(invalid="ignore", divide="ignore"):
        l00 = np.sqrt(i00 * scale)
        l10 = i01 * scale / l00
        l11 = np.sqrt(np.maximum(i11 * scale - l10**2, 0.0))
    lin = np.column_stack([r0c, ac]).clip(0.0, 1.0)  # fallback for draws never inside [0, 1]^2
    todo = np.arange(n_draws)
    for _ in range(50):  # (R0, A) | cell is bivariate t, truncated to [0, 1]^2 by rejection
        z = rng.standard_normal((todo.size, 2))
        t = np.sqrt(dof / rng.chisquare(dof, todo.size))
        r0 = r0c[todo] + l00[todo] * z[:, 0] * t
        a = ac[todo] + (l10[todo] * z[:, 0] + l11[todo] * z[:, 1]) * t
        ok = (a >= 0) & (a <= 1) & (r0 >= 0) & (r0 <= 1)
        lin[todo[ok]] = np.column_stack([r0[ok], a[ok]])
        todo = todo[~ok]
        if todo.size == 0:
            break
    if r0_fixed is not None:
        lin[:, 0] = r0_fixed
    iu, ib = np.divmod(cell, lbs.size)
    du, db = us[1] - us[0], lbs[1] - lbs[0]
    u = us[iu] + rng.uniform(-0.5, 0.5, n_draws) * du
    lb = lbs[ib] + rng.uniform(-0.5, 0.5, n_draws) * db
    mass = wts.reshape(lp.shape).sum(axis=0).reshape(nu, nb)
    resolved = _resolves(mass / mass.sum())
    return np.column_stack([lin[:, 1], np.exp(lb), np.exp(u), lin[:, 0]]), resolved


# ---------------------------------------------------------------------------------------------- power law


def _pow_fj_factory(x: np.ndarray):
    """theta = (A, B, logD); f = A - exp(logD - B x)."""

    def fj(th, idx=None):
        A = th[:, 0:1]
        B = th[:, 1:2]
        ld = th[:, 2:3]
        g = np.exp(np.clip(ld - B * x[None, :], -700, 700))
        f = A - g
        J = np.stack([np.ones_like(g), g * x[None, :], -g], axis=-1)
        return f, J

    return fj


def _fit_power(x: np.ndarray, y: np.ndarray):
    from scipy.optimize import least_squares

    Bs = np.geomspace(0.02, 8.0, 80)
    G = np.exp(-Bs[:, None] * (x[None, :] - x.mean()))  # scaled for conditioning
    best = None
    for k, B in enumerate(Bs):
        M = np.stack([np.ones_like(x), -G[k]], axis=1)
        coef, *_ = np.linalg.lstsq(M, y, rcond=None)
        A, Ds = coef
        if Ds <= 0:
            continue
        if A > 1.0:
            A = 1.0
            Ds = max(float(G[k] @ (A - y)) / float(G[k] @ G[k]), 1e-12)
        r = y - (A - Ds * G[k])
        c = float(r @ r)
        if best is None or c < best[0]:
            best = (c, A, B, math.log(Ds) + B * x.mean())
    if best is None:
        best = (0.0, min(float(y.max()), 1.0), 0.5, math.log(max(float(y.max() - y.min()), 1e-6)) + 0.5 * x.min())
    _, A0, B0, ld0 = best
    ld_lo, ld_hi = -50.0, 50.0 + 30.0 * float(np.abs(x).max())
    lo = np.array([0.0, 1e-3, ld_lo])
    hi = np.array([1.0, 20.0, ld_hi])
    fj = _pow_fj_factory(x)

    def res(th):
        return fj(th[None, :])[0][0] - y

    def jac(th):
        return fj(th[None, :])[1][0]

    th0 = np.clip(np.array([A0, B0, ld0]), lo + 1e-9, hi - 1e-9)
    sol = least_squares(res, th0, jac=jac, bounds=(lo, hi), method="trf", x_scale="jac",
                        ftol=1e-12, xtol=1e-12, gtol=1e-12, max_nfev=LSQ_MAX_NFEV)
    return sol.x.copy(), float(2 * sol.cost), (lo, hi)


# ---------------------------------------------------------------------------------------------- paper A.5

PAPER_A_GRID = np.round(np.arange(0.450, 0.800 + 1e-9, 0.005), 3)
PAPER_CMID_GRID = np.linspace(100.0, 40000.0, 100)
PAPER_A_MARGIN = 0.02


def _paper_grid_fit(c: np.ndarray, y: np.ndarray, r0: float, exact: bool = False):
    """For every (A, C_mid) of the paper's grid fit B by least squares from B = 1; returns (B, sse) grids.

    ``exact=True`` runs scipy's ``curve_fit`` per cell (the literal procedure; slow, ~7100 calls); the
    default is a vectorised Levenberg–Marquardt in B from the same start, which reaches the same optimum.
    """
    As, Cs = PAPER_A_GRID, PAPER_CMID_GRID
    x = np.log(c)
    if exact:
        import warnings as _w

        from scipy.optimize import curve_fit

        Bg = np.full((As.size, Cs.size), np.nan)
        Sg = np.full((As.size, Cs.size), np.inf)
        for i, A in enumerate(As):
            for j, Cm in enumerate(Cs):
                f = lambda cc, B, A=A, Cm=Cm: sigmoid_curve(cc, A, B, Cm, r0)  # noqa: E731
                try:
                    with _w.catch_warnings():
                        _w.simplefilter("ignore")
                        (B,), _ = curve_fit(f, c, y, p0=[1.0], maxfev=2000)
                except RuntimeError:
                    continue
                r = y - f(c, B)
                Bg[i, j], Sg[i, j] = B, float(r @ r)
        return Bg, Sg
    Agrid = np.repeat(As, Cs.size)
    ugrid = np.tile(np.log(Cs), As.size)
    K = Agrid.size
    Ak = (Agrid - r0)[:, None]
    d = x[None, :] - ugrid[:, None]

    def fj(th, idx):
        s = _expit(th * d[idx])
        return r0 + Ak[idx] * s, (Ak[idx] * s * (1 - s) * d[idx])[..., None]

    th, sse = _batched_lm(fj, np.ones((K, 1)), np.broadcast_to(y, (K, y.size)).copy(),
                          np.full(1, -50.0), np.full(1, 50.0), iters=60)
    return th[:, 0].reshape(As.size, Cs.size), sse.reshape(As.size, Cs.size)


# ---------------------------------------------------------------------------------------------- backtest

BACKTEST_MIN_POINTS = 10
BACKTEST_PREFIX = 0.6  # share of the window's points the backtest fits
BACKTEST_LATE = 0.25  # share of the window's last points it predicts (their mean)
BACKTEST_Z = 1.645  # a miss beyond this many predicted sds widens the intervals proportionally
BACKTEST_MAX = 3.0


def _backtest_inflation(c, v, cf, yf, r0, min_compute, seed) -> float:
    """Fit the first BACKTEST_PREFIX of the window's points, predict the mean of its last BACKTEST_LATE points.

    Returns the factor by which to widen the intervals: |miss| / (BACKTEST_Z sd) where sd combines the prefix fit's
    bootstrap spread with the white noise of that mean and the drift (which moves the whole mean), both as the
    prefix estimates them; at least 1.
    Slow drift that bends the end of the window (a plateau the prefix did not predict, or a late jump) shows up
    here as a miss the bootstrap alone calls unlikely.
    """
    n = cf.size
    k = max(int(math.ceil(BACKTEST_PREFIX * n)), 6)
    m = max(int(math.ceil(BACKTEST_LATE * n)), 2)
    if k + m > n:
        return 1.0
    try:
        pre = fit_curve(c, v, model="sigmoid", min_compute=min_compute, fit_until=float(cf[k - 1]), r0=r0,
                        seed=seed + 1, n_boot=100, backtest=False, posterior=False)
    except CurveError:
        return 1.0
    late_c = cf[-m:]
    pred = float(pre.predict(late_c).mean())
    ys = pre.predict_samples(late_c)
    var_boot = float(np.nanvar(ys.mean(axis=1))) if ys is not None else 0.0
    sw, sd, _ = pre.noise  # the prefix's noise: the full fit's would count a late bend as drift
    sd_pred = math.sqrt(var_boot + sw * sw / m + sd * sd)
    if sd_pred <= 0:
        return 1.0
    z = abs(float(yf[-m:].mean()) - pred) / sd_pred
    return float(min(max(z / BACKTEST_Z, 1.0), BACKTEST_MAX))


def _widen(samples: np.ndarray, params: dict, f: float) -> np.ndarray:
    """Scale the bootstrap replicates' spread around the estimate by f (A linearly, B and C_mid in log)."""
    s = samples.copy()
    s[:, 0] = np.clip(params["A"] + f * (s[:, 0] - params["A"]), 0.0, 1.0)
    s[:, 1] = params["B"] * np.exp(f * np.log(np.maximum(s[:, 1], 1e-12) / params["B"]))
    s[:, 2] = params["C_mid"] * np.exp(f * np.log(np.maximum(s[:, 2], 1e-300) / params["C_mid"]))
    return s


# ---------------------------------------------------------------------------------------------- main


def fit_curve(
    compute: Sequence[float],
    values: Sequence[float],
    *,
    model: str = "sigmoid",
    min_compute: float = 0.0,
    fit_until: float | None = None,
    r0: float | None = None,
    level: float = 0.8,
    predict_at: Iterable[float] = (),
    seed: int = 0,
    n_boot: int = N_BOOT,
    backtest: bool = True,
    posterior: bool = True,
    discrepancy: float = MODEL_DISCREPANCY,
) -> FitResult:
    """Fit a compute->performance curve.

    compute must be strictly increasing and >= 0, values pass rates in [0, 1].  The point at compute 0
    (if any) gives R0 unless ``r0`` is passed; it is never part of the fit window otherwise.  The fit
    window is ``min_compute <= C <= fit_until`` (C > 0).  Without a compute-0 point and without ``r0`` the
    sigmoid fits R0 as a fourth parameter.  ``level`` is the two-sided interval level.  ``backtest`` (sigmoid)
    calibrates the intervals by a backtest inside the window (see ``_backtest_inflation``).  ``posterior``
    (sigmoid) takes the point estimate from the model-averaged posterior (``_sigmoid_posterior``); without it the
    point estimate is the penalised least-squares optimum (the backtest's prefix fit needs only the spread).
    ``discrepancy`` (sigmoid) is the model discrepancy's sd per e-fold of compute past the window as a share of
    the fitted gain A - R0 (``MODEL_DISCREPANCY``; 0 leaves the predictions with the bootstrap alone).
    """
    if model not in MODELS:
        raise CurveError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    if not (0.0 < level < 1.0):
        raise CurveError(f"level must be in (0, 1), got {level}")
    if not (math.isfinite(discrepancy) and discrepancy >= 0.0):
        raise CurveError(f"discrepancy must be finite and >= 0, got {discrepancy}")
    c, v = _as_curve(compute, values)
    if r0 is not None and not (0.0 <= r0 <= 1.0):
        raise CurveError(f"r0 must be in [0, 1], got {r0}")
    if fit_until is not None and fit_until <= min_compute:
        raise CurveError(f"fit_until ({fit_until:g}) must be above min_compute ({min_compute:g})")
    pred_c = [float(p) for p in predict_at]
    if any((not math.isfinite(p)) or p < 0 for p in pred_c):
        raise CurveError("predict_at values must be finite and >= 0")

    r0_from_point = False
    if r0 is None and c[0] == 0.0:
        r0 = float(v[0])
        r0_from_point = True
    mask = (c > 0) & (c >= min_compute)
    if fit_until is not None:
        mask &= c <= fit_until
    cf, yf = c[mask], v[mask]
    n_params = {"sigmoid": 3 if r0 is not None else 4, "power": 3, "paper": 2}[model]
    need = n_params + 2
    if cf.size < need:
        window = f"[{min_compute:g}, {fit_until:g}]" if fit_until is not None else f">= {min_compute:g}"
        raise TooFewPoints(
            f"too few points to fit: {cf.size} point(s) with compute {window} (need at least {need}); "
            "lower min_compute or add points"
        )
    if model == "paper" and r0 is None:
        raise CurveError("the paper procedure needs R0: give a point at compute 0 or pass r0")

    rng = np.random.default_rng(seed)
    warns: list[str] = []
    x = np.log(cf)
    n = cf.size
    window = (float(cf[0]), float(cf[-1]))
    q = (1 - level) / 2

    if model == "paper":
        return _finish_paper(cf, yf, float(r0), level, pred_c, window, c, v)

    if model == "sigmoid":
        th, sse, (lo, hi) = _fit_sigmoid(x, yf, r0)
        free = not r0_from_point and r0 is None

        def _noise_at(th):
            resid = yf - sigmoid_curve(cf, th[0], th[1], math.exp(th[2]), th[3])
            th_fit = th if free else th[:3]
            X = _sig_fj_factory(x, None if free else np.array([[th[3]]]), free)(th_fit[None, :])[1][0]
            trend = _noise_trend(resid)
            return _noise_model_reml(resid / trend, X / trend[:, None]), trend

        noise, trend = _noise_at(th)
        prior = (_prior_scale(noise), math.log(B_PRIOR), B_PRIOR_SD, float(x[-1]), CMID_PRIOR_SD)
        if prior[0] > 0:
            th, sse, _ = _fit_sigmoid(x, yf, r0, prior=prior, start=th)
            noise, trend = _noise_at(th)
        # what is reported is the noise where the window ends: the size of the validation noise now
        noise_end = (noise[0] * float(trend[-1]), noise[1] * float(trend[-1]), noise[2])
        sigma = math.hypot(noise_end[0], noise_end[1])
        A, B, u, R0 = (float(t) for t in th)
        params = {"A": A, "B": B, "C_mid": math.exp(u), "R0": R0}
        # ---- parametric bootstrap, warm-started batched LM
        K = n_boot
        fitted = sigmoid_curve(cf, A, B, math.exp(u), R0)
        boot_noise = (noise[0], DRIFT_BOOT_INFLATE * noise[1], noise[2])
        ystar = fitted[None, :] + trend[None, :] * _sim_noise(rng, K, n, boot_noise)
        ystar = np.concatenate([ystar, np.zeros((K, 2))], axis=1)
        if free:
            th0 = np.tile(th, (K, 1))
            fj = _with_prior(_sig_fj_factory(x, None, True), prior)
            ths, _ = _batched_lm(fj, th0, ystar, lo, hi)
            r0s = ths[:, 3]
        else:
            r0s = np.full(K, R0)
            if r0_from_point:
                r0s = np.clip(R0 + rng.standard_normal(K) * math.hypot(*noise[:2]) * float(trend[0]), 0.0, 1.0)
            fj = _with_prior(_sig_fj_factory(x, r0s[:, None], False), prior)
            ths, _ = _batched_lm(fj, np.tile(th[:3], (K, 1)), ystar, lo[:3], hi[:3])
        samples = np.column_stack([ths[:, 0], ths[:, 1], np.exp(ths[:, 2]), r0s])
        if backtest and n >= BACKTEST_MIN_POINTS:
            f_infl = _backtest_inflation(c, v, cf, yf, r0 if not r0_from_point else None, min_compute, seed)
            if f_infl > 1.0:
                samples = _widen(samples, params, f_infl)
                warns.append(f"backtest inside the window: a fit of the first {BACKTEST_PREFIX:.0%} of the points "
                             f"missed the later points by more than its interval; intervals widened x{f_infl:.2f}")
        draws, resolved = (None, False) if not posterior else _sigmoid_posterior(
            x, yf, R0 if r0_from_point else None, float(r0) if r0 is not None and not r0_from_point else None,
            prior, rng)
        if resolved:
            # the point estimate is the posterior median of A, B and C_mid (the least-squares optimum above only
            # centres the bootstrap): where the window cannot tell a late midpoint with a high ceiling from an
            # early one with a lower ceiling, the median weighs both instead of picking one.  R0 stays what the
            # compute-0 point (or the caller) says.
            med = np.median(draws, axis=0)
            params.update(A=float(med[0]), B=float(med[1]), C_mid=float(med[2]))
            if free:
                params["R0"] = float(med[3])
            A, B, u = params["A"], params["B"], math.log(params["C_mid"])
        at_bound_u = u >= hi[2] - 1e-6
    else:  # power
        th, sse, (lo, hi) = _fit_power(x, yf)
        A, B, ld = (float(t) for t in th)
        R0 = float(r0) if r0 is not None else float("nan")
        params = {"A": A, "B": B, "D": math.exp(ld), "R0": R0}
        fitted = power_curve(cf, A, B, math.exp(ld))
        resid = yf - fitted
        noise = _noise_model_reml(resid, _pow_fj_factory(x)(th[None, :])[1][0])
        sigma = math.hypot(noise[0], noise[1])
        K = n_boot
        ystar = fitted[None, :] + _sim_noise(rng, K, n, noise)
        ths, _ = _batched_lm(_pow_fj_factory(x), np.tile(th, (K, 1)), ystar, lo, hi)
        samples = np.column_stack([ths[:, 0], ths[:, 1], np.exp(ths[:, 2]), np.full(K, R0)])
        at_bound_u = False
        noise_end = noise

    names = list(params)
    intervals: dict[str, tuple[float, float]] = {}
    for k, name in enumerate(names):
        col = samples[:, k]
        if not np.all(np.isfinite(col)):
            intervals[name] = (params[name], params[name])
            continue
        lo_i, hi_i = _quantile_interval(col[:, None], np.array([params[name]]), q)
        intervals[name] = (float(lo_i[0]), float(hi_i[0]))
    if model == "sigmoid" and r0 is not None and not r0_from_point:
        intervals["R0"] = (params["R0"], params["R0"])

    res = FitResult(
        model=model, params=params, intervals=intervals, predictions=[], identifiable=True,
        warnings=warns, level=level, n_points=int(n), fit_window=window, sigma=sigma,
        rmse=math.sqrt(sse / n), noise=tuple(float(t) for t in noise_end), samples=samples, data=(c, v),
        discrepancy=discrepancy * abs(params["A"] - params["R0"]) if model == "sigmoid" else 0.0,
    )
    res.predictions = [res.prediction(p) for p in pred_c]

    # ---- identifiability
    a_lo, a_hi = intervals["A"]
    if a_hi - a_lo > MAX_A_WIDTH:
        res.identifiable = False
        warns.append(
            f"ceiling A not identifiable yet: {level:.0%} interval on A is [{a_lo:.3f}, {a_hi:.3f}] "
            f"(width {a_hi - a_lo:.3f} > {MAX_A_WIDTH}); extend the run before trusting A"
        )
    if params["A"] >= 1.0 - 1e-6:
        res.identifiable = False
        warns.append("fitted A sits at the bound 1.0: the curve shows no saturation in the fit window")
    if model == "sigmoid":
        cm_hi = intervals["C_mid"][1]
        if at_bound_u or cm_hi > MAX_CMID_FACTOR * window[1]:
            res.identifiable = False
            warns.append(
                f"C_mid not identifiable: interval upper end {cm_hi:.4g} is beyond "
                f"{MAX_CMID_FACTOR:g}x the last fitted compute {window[1]:.4g}"
            )
        else:
            # share of the total gain reached at the end of the window, taking C_mid at its upper end
            seen = 1.0 / (1.0 + (cm_hi / window[1]) ** params["B"])
            if seen < MIN_GAIN_SEEN:
                res.identifiable = False
                where = "beyond" if params["C_mid"] > window[1] else "near the end of"
                warns.append(
                    f"C_mid ({params['C_mid']:.4g}, interval up to {cm_hi:.4g}) lies {where} the fit window "
                    f"(last point {window[1]:.4g}): only ~{seen:.0%} of the gain is observed, so A is an "
                    "extrapolation; ceiling not identifiable yet"
                )
        k = max(3, round(END_SHARE * n))
        miss = float(np.mean(yf[-k:] - res.predict(cf[-k:])))
        miss_sd = math.hypot(noise_end[0] / math.sqrt(k), noise_end[1])
        if abs(miss) > max(MAX_END_MISS_SDS * miss_sd, END_MISS_FLOOR):
            res.identifiable = False
            warns.append(
                f"the fitted curve misses the window's last {k} points by {miss:+.3f} on average "
                f"({abs(miss) / max(miss_sd, 1e-12):.0f} noise sds): the curve does not follow a sigmoid there (a jump "
                "or a fall inside the window?), so the ceiling is not identifiable from this window; fit from past "
                "the change (the recipe's forecast.min_compute, --min-compute) or wait for more points"
            )
    if model == "power":
        warns.append("power law has no R0 and over-estimates the ceiling unless fitted far out (paper A.4)")
    for p in res.predictions:
        if p.compute > 4 * window[1]:
            warns.append(f"prediction at {p.compute:g} is more than 4x beyond the fit window ({window[1]:g})")
    return res


def _finish_paper(cf, yf, r0, level, pred_c, window, c, v) -> FitResult:
    Bg, Sg = _paper_grid_fit(cf, yf, r0)
    Sg = np.where(np.isfinite(Sg), Sg, np.inf)
    i, j = np.unravel_index(int(np.argmin(Sg)), Sg.shape)
    As, Cs = PAPER_A_GRID, PAPER_CMID_GRID
    A, Cm, B = float(As[i]), float(Cs[j]), float(Bg[i, j])
    params = {"A": A, "B": B, "C_mid": Cm, "R0": r0}
    # +-0.02 envelope: best (C_mid, B) for every grid A within the margin
    rows = []
    for ii in np.nonzero(np.abs(As - A) <= PAPER_A_MARGIN + 1e-9)[0]:
        jj = int(np.argmin(Sg[ii]))
        rows.append((float(As[ii]), float(Bg[ii, jj]), float(Cs[jj]), r0))
    samples = np.array(rows)
    intervals = {
        "A": (max(A - PAPER_A_MARGIN, 0.0), min(A + PAPER_A_MARGIN, 1.0)),
        "B": (float(samples[:, 1].min()), float(samples[:, 1].max())),
        "C_mid": (float(samples[:, 2].min()), float(samples[:, 2].max())),
        "R0": (r0, r0),
    }
    warns = ["paper procedure: intervals are the paper's fixed +-0.02 margin on A, not level-calibrated"]
    ident = True
    if i in (0, As.size - 1):
        ident = False
        warns.append(f"A = {A:.3f} is at the edge of the paper's grid [0.450, 0.800]")
    if j in (0, Cs.size - 1):
        ident = False
        warns.append(f"C_mid = {Cm:g} is at the edge of the paper's grid [100, 40000]")
    sse = float(Sg[i, j])
    n = cf.size
    resid_sigma = math.sqrt(sse / max(n - 3, 1))
    res = FitResult(
        model="paper", params=params, intervals=intervals, predictions=[], identifiable=ident,
        warnings=warns, level=level, n_points=int(n), fit_window=window, sigma=resid_sigma,
        rmse=math.sqrt(sse / n), samples=samples, data=(c, v),
    )
    res.predictions = [res.prediction(p) for p in pred_c]
    return res


# ---------------------------------------------------------------------------------------------- halfway check

FINAL_POINTS = 3  # the run's final pass rate: the mean of its last points, which de-noises one evaluation


@dataclass
class HalfwayCheck:
    """The forecast a run could have made at half its compute, scored against how the run ended."""

    fit: FitResult  # fitted on the points up to half the last compute, predicting the last compute
    final: float  # the mean of the last FINAL_POINTS values

    @property
    def predicted(self) -> Prediction:
        return self.fit.predictions[0]

    @property
    def error(self) -> float:
        return self.predicted.value - self.final


def halfway_check(compute: Sequence[float], values: Sequence[float], *, min_compute: float = 0.0,
                  level: float = 0.8, fraction: float = 0.5) -> HalfwayCheck | None:
    """Fit the sigmoid on the first half (``fraction``) of the run's compute and predict where the run ended; None
    when that share holds too few points to fit (any other CurveError, such as min_compute beyond it, is raised)."""
    c, v = _as_curve(compute, values)
    try:
        fit = fit_curve(c, v, model="sigmoid", min_compute=min_compute, fit_until=float(c[-1]) * fraction,
                        level=level, predict_at=[float(c[-1])])
    except TooFewPoints:
        return None
    return HalfwayCheck(fit=fit, final=float(np.mean(v[-FINAL_POINTS:])))
