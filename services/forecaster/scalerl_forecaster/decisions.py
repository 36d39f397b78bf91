"""Decisions from fitted curves: value at a budget, compute to reach a target, doubling gain, comparisons of two
runs (ceiling mover / efficiency shaper) and scale-or-stop advice for one."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .fit import MAX_A_WIDTH, MAX_CMID_FACTOR, MIN_GAIN_SEEN, FitResult, Prediction

__all__ = [
    "predict_at",
    "compute_to_reach",
    "reach",
    "Reach",
    "doubling_gain",
    "DoublingGain",
    "compare",
    "Comparison",
    "advise",
    "Advice",
    "compute_to_identify",
]


def predict_at(result: FitResult, budget: float) -> Prediction:
    """Predicted validation score (with interval at ``result.level``) after ``budget`` compute."""
    if not math.isfinite(budget) or budget < 0:
        raise ValueError(f"budget must be finite and >= 0, got {budget}")
    return result.prediction(float(budget))


@dataclass
class Reach:
    target: float
    compute: float | None
    interval: tuple[float, float] | None
    """At the fit's level.  The upper end is inf where more than the level's upper tail of the bootstrap's curves
    never reach the target or, past the fit window, the band's lower end does not within REACH_HORIZON; so it is
    inf whenever the fitted curve itself never reaches it (``compute`` None).  None when not even the band's upper
    end reaches it, or when the fit has no bootstrap replicates."""
    reason: str


def _inverse(model: str, A, B, third, R0, target):
    """Compute at which the curve reaches ``target``; nan where unreachable (vectorised)."""
    A, B, third, R0 = (np.asarray(t, dtype=float) for t in (A, B, third, R0))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if model == "power":
            # A - D C^-B = t  ->  C = (D / (A - t))^(1/B)
            gap = A - target
            out = np.where(gap > 0, (third / gap) ** (1.0 / B), np.nan)
            return out
        span = A - R0
        s = (target - R0) / span
        ok = (span > 0) & (s > 0) & (s < 1)
        out = np.where(ok, third / ((1.0 / s - 1.0) ** (1.0 / B)), np.nan)
        # at or below R0 from the start; a curve whose ceiling lies below R0 falls and never reaches more
        return np.where(target <= R0, 0.0, out)


def _quantile(x: np.ndarray, q: float) -> float:
    """Linearly interpolated quantile of values that may be +inf (a curve that never reaches a target): inf where
    it falls among them.  (numpy's interpolation gives inf - inf = nan there.)"""
    x = np.sort(x)
    pos = (x.size - 1) * q
    i, j = math.floor(pos), math.ceil(pos)
    if not math.isfinite(x[j]):
        return math.inf
    return float(x[i] + (x[j] - x[i]) * (pos - i))


REACH_HORIZON = 1e4
"""How far (x the compute it starts from) the predictive band is searched for the target; beyond it: never."""
REACH_GRID = 64
"""Points of each of the two log-compute grids of the search: the span, then the step that holds the crossing."""


def _band_crossing(result: FitResult, target: float, start: float, side: int) -> float:
    """First compute >= ``start`` at which the lower (``side`` 0) or upper (1) end of the predictive band reaches
    ``target``, interpolated in log compute; inf when it does not within REACH_HORIZON x ``start``."""
    lo, hi = start, start * REACH_HORIZON
    for _ in range(2):
        c = np.geomspace(lo, hi, REACH_GRID)
        band = result.predict_interval(c)[side]
        above = np.flatnonzero(band >= target)
        if not above.size:
            return math.inf
        i = int(above[0])
        if i == 0:
            return float(c[0])
        lo, hi = float(c[i - 1]), float(c[i])
    t = (target - band[i - 1]) / (band[i] - band[i - 1])
    return float(c[i - 1] * (c[i] / c[i - 1]) ** t)


def _with_discrepancy(result: FitResult, target: float, lo: float, hi: float) -> tuple[float, float]:
    """The bootstrap's interval on the compute to reach ``target``, widened where it lies past the fit window by
    the model discrepancy the predictions carry there: its ends are where the upper and the lower end of the
    predictive band (``FitResult.predict_interval``) reach the target, so the interval reads off the plotted band.
    Inside the window the band is the bootstrap's, and so is the interval."""
    end = result.window_end
    if end is None:
        return lo, hi
    if lo > end:
        lo = min(lo, _band_crossing(result, target, end, 1))
    if end < hi < math.inf:
        hi = max(hi, _band_crossing(result, target, hi, 0))
    return lo, hi


def _reach_interval(result: FitResult, target: float, point: float) -> tuple[tuple[float, float] | None, float]:
    """Interval on the compute to reach ``target``: the bootstrap's quantiles of where each curve reaches it (the
    paper's: the envelope fits' extremes), widened past the window by the model discrepancy; inf where too many
    curves never do.  It always holds ``point``, the fitted curve's own compute (inf: the fitted curve never gets
    there).  None without replicates or when not even its lower end is finite.  Also the share of the replicates
    that never reach the target."""
    if result.samples is None or not len(result.samples):
        return None, 0.0
    s = result.samples
    cs = _inverse(result.model, s[:, 0], s[:, 1], s[:, 2], s[:, 3], target)
    cs = np.where(np.isnan(cs), np.inf, cs)  # unreachable replicate: infinite compute
    if result.model == "paper":
        lo, hi = float(np.min(cs)), float(np.max(cs))
    else:
        q = (1 - result.level) / 2
        lo, hi = _quantile(cs, q), _quantile(cs, 1 - q)
    # the band stops at 1, so it would "reach" a target of 1 only by that cap
    if result.discrepancy > 0 and target < 1.0:
        lo, hi = _with_discrepancy(result, target, lo, hi)
    lo, hi = min(lo, point), max(hi, point)  # the fitted curve's own compute (inf: it never gets there)
    return ((lo, hi) if math.isfinite(lo) else None), float(np.mean(~np.isfinite(cs)))


def reach(result: FitResult, target: float) -> Reach:
    """Compute needed to reach ``target`` (with an interval from the bootstrap and, past the fit window, the model
    discrepancy), or None + reason.  A target beyond the fitted ceiling still gets an interval, open above, where
    the band reaches it."""
    c = compute_to_reach(result, target)
    p = result.params
    if c == 0.0:
        return Reach(target, 0.0, (0.0, 0.0), f"already reached: R0 = {p['R0']:.3f} >= target")
    interval, never = _reach_interval(result, target, math.inf if c is None else c)
    if c is None:
        reason = (f"not reachable: ceiling below target (A = {p['A']:.3f}, {result.level:.0%} interval "
                  f"[{result.intervals['A'][0]:.3f}, {result.intervals['A'][1]:.3f}] vs target {target:.3f})")
        if interval is not None:
            band = ("the ±0.02 fits' envelope" if result.model == "paper"
                    else f"the upper end of the {result.level:.0%} band")
            reason += f"; {band} reaches it at compute {interval[0]:.4g}"
        return Reach(target, None, interval, reason)
    reason = f"reachable, but {never:.0%} of bootstrap curves never reach it" if never > 0 else "reachable"
    if not result.identifiable:
        reason += " (curve not identifiable yet: treat as a rough guess)"
    return Reach(target, c, interval, reason)


def compute_to_reach(result: FitResult, target: float) -> float | None:
    """Compute needed to reach ``target`` by the fitted curve; 0 when R0 is already there, None when the fitted
    ceiling A is at or below the target.

    Only the point, which costs one inversion: use :func:`reach` for the interval and the reason.
    """
    if not (0.0 <= target <= 1.0):
        raise ValueError(f"target must be a pass rate in [0, 1], got {target}")
    p = result.params
    if result.model != "power" and target <= p["R0"]:
        return 0.0
    if target >= p["A"]:
        return None
    third = p["D"] if result.model == "power" else p["C_mid"]
    return float(_inverse(result.model, p["A"], p["B"], third, p["R0"], target))


@dataclass
class DoublingGain:
    budget: float
    value: float
    value_doubled: float
    gain: float
    interval: tuple[float, float]


def doubling_gain(result: FitResult, budget: float) -> DoublingGain:
    """Marginal gain of doubling the budget: R(2C) - R(C), with interval."""
    c = np.array([budget, 2 * budget], dtype=float)
    v = result.predict(c)
    gain = float(v[1] - v[0])
    ys = result.predict_samples(c)
    if ys is None:
        iv = (gain, gain)
    else:
        g = ys[:, 1] - ys[:, 0]
        if result.model == "paper":
            iv = (float(g.min()), float(g.max()))
        else:
            q = (1 - result.level) / 2
            iv = (float(np.quantile(g, q)), float(np.quantile(g, 1 - q)))
        iv = (min(iv[0], gain), max(iv[1], gain))
    return DoublingGain(float(budget), float(v[0]), float(v[1]), gain, iv)


@dataclass
class ParamDiff:
    name: str
    a: float
    b: float
    diff: float  # b - a (for C_mid: log ratio log(b / a))
    interval: tuple[float, float]
    significant: bool


@dataclass
class Comparison:
    A: ParamDiff
    B: ParamDiff
    C_mid: ParamDiff
    higher_ceiling: str | None  # "a", "b" or None (within noise)
    more_efficient: str | None  # by lower C_mid (else higher B), only when the efficiency test rejects
    verdict: str  # "ceiling mover", "efficiency shaper", "both", "no difference beyond noise"
    summary: str
    notes: list[str] = field(default_factory=list)
    level: float = 0.95
    ceiling_p: float = float("nan")
    """Bootstrap p-value of "same A" (two-sided)."""
    efficiency_p: float = float("nan")
    """Bootstrap p-value of "same (B, log C_mid)" (joint Mahalanobis test)."""


def _diff(name: str, ra: FitResult, rb: FitResult, idx: int, level: float, log: bool = False) -> ParamDiff:
    a, b = ra.params[name], rb.params[name]
    tf = np.log if log else (lambda z: z)
    d = float(tf(b) - tf(a))
    ds = _sample_diffs(ra, rb, [idx], [log])
    if ds is not None:
        q = (1 - level) / 2
        lo, hi = float(np.quantile(ds[:, 0], q)), float(np.quantile(ds[:, 0], 1 - q))
    else:  # envelope / intervals only: conservative difference of intervals
        la, ha = (tf(v) for v in ra.intervals[name])
        lb, hb = (tf(v) for v in rb.intervals[name])
        lo, hi = float(lb - ha), float(hb - la)
    lo, hi = min(lo, d), max(hi, d)
    return ParamDiff(name, float(a), float(b), d, (lo, hi), bool(lo > 0 or hi < 0))


def _sample_diffs(ra: FitResult, rb: FitResult, cols: list[int], logs: list[bool]) -> np.ndarray | None:
    """Bootstrap replicates of b - a for the given parameter columns (rows with a non-finite value dropped);
    None for fits without bootstrap replicates (the paper's envelope)."""
    sa, sb = ra.samples, rb.samples
    if sa is None or sb is None or not len(sa) or not len(sb) or "paper" in (ra.model, rb.model):
        return None
    m = min(len(sa), len(sb))
    out = []
    with np.errstate(divide="ignore", invalid="ignore"):
        for col, log in zip(cols, logs):
            tf = np.log if log else (lambda z: z)
            # independent runs: replicate k of a and of b are independent draws, so pairing by index is random
            out.append(tf(sb[:m, col]) - tf(sa[:m, col]))
    ds = np.column_stack(out)
    return ds[np.all(np.isfinite(ds), axis=1)]


def _boot_p(observed: np.ndarray, ds: np.ndarray) -> float:
    """Bootstrap p-value of "no difference": share of centred replicates at least as far from 0 as the observed
    difference, distance measured in the replicates' own covariance (Mahalanobis; |z| for one parameter)."""
    if len(ds) < 20:
        return float("nan")
    centred = ds - ds.mean(axis=0)
    cov = np.atleast_2d(np.cov(centred, rowvar=False))
    inv = np.linalg.pinv(cov)
    t_obs = float(observed @ inv @ observed)
    t = np.einsum("ki,ij,kj->k", centred, inv, centred)
    return float((1 + np.sum(t >= t_obs)) / (1 + len(t)))


COMPARE_LEVEL = 0.95


def compare(ra: FitResult, rb: FitResult, *, level: float = COMPARE_LEVEL) -> Comparison:
    """Compare two fitted curves (a vs b): is one ceiling higher beyond noise, which is more efficient.

    Ceiling movers change A; efficiency shapers change B / C_mid. Two tests share the error budget
    alpha = 1 - ``level`` (Bonferroni, so identical curves get a verdict other than "no difference" at most
    alpha of the time):

    * ceiling: the (1 - alpha/2) bootstrap percentile interval of A_b - A_a excludes 0;
    * efficiency: a joint bootstrap test of (B_b - B_a, log C_mid_b - log C_mid_a): the observed difference's
      Mahalanobis distance (in the covariance of the replicate differences) is beyond the 1 - alpha/2 quantile
      of the centred replicates' distances. B and C_mid are strongly correlated in a fit, so one joint test
      instead of two separate ones keeps the error rate at its nominal level.

    The per-parameter intervals reported (ParamDiff) are at ``level``. Fits without bootstrap replicates (the
    paper's envelope) fall back to the conservative difference of their intervals.
    """
    if ra.model == "power" or rb.model == "power":
        raise ValueError("compare needs sigmoid (or paper) fits, not power-law fits")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    lv = level
    alpha = 1.0 - lv
    dA = _diff("A", ra, rb, 0, lv)
    dB = _diff("B", ra, rb, 1, lv)
    dC = _diff("C_mid", ra, rb, 2, lv, log=True)
    ds = _sample_diffs(ra, rb, [0, 1, 2], [False, False, True])
    if ds is not None and len(ds) >= 20:
        ceiling_p = _boot_p(np.array([dA.diff]), ds[:, :1])
        wide = _diff("A", ra, rb, 0, 1.0 - alpha / 2)
        ceiling = wide.significant
        efficiency_p = _boot_p(np.array([dB.diff, dC.diff]), ds[:, 1:])
        efficiency = efficiency_p < alpha / 2
    else:
        ceiling_p = efficiency_p = float("nan")
        ceiling = dA.significant
        efficiency = dB.significant or dC.significant
    higher = ("b" if dA.diff > 0 else "a") if ceiling else None
    more_eff = None
    if efficiency:
        if dC.significant or not dB.significant:
            more_eff = "b" if dC.diff < 0 else "a"
        else:
            more_eff = "b" if dB.diff > 0 else "a"
    notes = []
    if dB.significant and dC.significant and (dB.diff > 0) == (dC.diff > 0):
        notes.append("B and C_mid point in opposite directions (higher B but later midpoint)")
    if not (ra.identifiable and rb.identifiable):
        notes.append("at least one curve is not identifiable yet; differences are uncertain")
    if ceiling and efficiency:
        verdict = "both"
    elif ceiling:
        verdict = "ceiling mover"
    elif efficiency:
        verdict = "efficiency shaper"
    else:
        verdict = "no difference beyond noise"
    parts = [
        f"A: a={dA.a:.3f} b={dA.b:.3f} (b-a {dA.diff:+.3f}, {lv:.0%} [{dA.interval[0]:+.3f}, {dA.interval[1]:+.3f}], "
        f"p={ceiling_p:.3f})" + (f" -> higher ceiling: {higher}" if higher else " -> same ceiling within noise"),
        f"B: a={dB.a:.2f} b={dB.b:.2f} (b-a {dB.diff:+.2f}, [{dB.interval[0]:+.2f}, {dB.interval[1]:+.2f}])",
        f"C_mid: a={dC.a:.4g} b={dC.b:.4g} (ratio b/a {math.exp(dC.diff):.2f}, "
        f"[{math.exp(dC.interval[0]):.2f}, {math.exp(dC.interval[1]):.2f}])",
        f"efficiency (B, C_mid jointly): p={efficiency_p:.3f}"
        + (f" -> more efficient: {more_eff}" if more_eff else " -> same efficiency within noise"),
        f"verdict at {lv:.0%}: {verdict}",
    ]
    return Comparison(dA, dB, dC, higher, more_eff, verdict, "\n".join(parts), notes, lv, ceiling_p, efficiency_p)


# ---------------------------------------------------------------------------------------------- scale or stop

ADVICE_FACTORS = (2.0, 4.0, 10.0)
"""Multiples of the compute spent at which the advice predicts the pass rate."""
IDENTIFY_MAX_FACTOR = 100.0
"""Beyond this multiple of the compute spent the advice only says "more than"."""
A_WIDTH_SHRINK = 2 / 3
"""A's interval is taken to narrow as (compute)^-A_WIDTH_SHRINK once the rise is seen. On prefixes of the platform's
recorded runs that later became identifiable this errs early on 10 %, and late by a median 2.1x (docs/decisions.md);
0.5, a white-noise mean, erred late by 3.7x, 1.0 early on 27 %."""
A_WIDTH_MARGIN = 0.9
"""Aim A's width this far below MAX_A_WIDTH: the interval is re-estimated on new noise."""

CONTINUE, STOP, UNDECIDED = "continue", "stop", "not decidable yet"


@dataclass
class Advice:
    spent: float
    """Compute of the latest fitted point (the x-axis unit of the fit)."""
    predictions: list[Prediction]
    """Predicted pass rate at ADVICE_FACTORS x spent, with intervals at the fit's level."""
    gain: float
    """R(10 x spent) - R(spent) by the fit."""
    gain_interval: tuple[float, float]
    target: float | None
    to_target: Reach | None
    recommendation: str
    """"continue", "stop" or "not decidable yet"."""
    reason: str
    compute_to_identify: float | None = None
    """When not decidable: total compute at which a run that follows the current fit is expected to have an
    identifiable fit (None: not within IDENTIFY_MAX_FACTOR x spent, or the fit is decidable)."""


def compute_to_identify(result: FitResult, spent: float) -> float | None:
    """Total compute at which the fit should become identifiable (None: beyond IDENTIFY_MAX_FACTOR x ``spent``, or
    nothing this rule models stands in the way, such as a fitted A at its bound).

    From the identifiability rule itself (``fit.MIN_GAIN_SEEN``, ``fit.MAX_CMID_FACTOR``, ``fit.MAX_A_WIDTH``): the
    fit window must reach far enough that even a midpoint at the upper end of C_mid's current interval has
    MIN_GAIN_SEEN of the gain observed, C >= C_mid_hi * (s / (1 - s))^(1/B), and lie within MAX_CMID_FACTOR of
    C_mid_hi. The interval narrows as points arrive, so this errs late rather than early (a preposterior simulation
    from the point estimate was tried and erred early: an early fit usually under-estimates C_mid). And A's
    interval must narrow to MAX_A_WIDTH: width * (C / spent)^-A_WIDTH_SHRINK <= A_WIDTH_MARGIN * MAX_A_WIDTH.
    """
    return _to_identify(result, spent)[0]


def _to_identify(result: FitResult, spent: float) -> tuple[float | None, str]:
    """compute_to_identify and what sets it."""
    if result.model != "sigmoid" or not spent > 0:
        return None, ""
    cm_hi = result.intervals["C_mid"][1]
    b = result.params["B"]
    if not (math.isfinite(cm_hi) and math.isfinite(b) and b > 0):
        return None, ""
    seen = MIN_GAIN_SEEN + 0.05  # a margin over the threshold: the interval is re-estimated on new noise
    needs = {"even the late end of C_mid's interval shows most of the gain":
             max(cm_hi * (seen / (1.0 - seen)) ** (1.0 / b), cm_hi / MAX_CMID_FACTOR)}
    a_lo, a_hi = result.intervals["A"]
    if a_hi - a_lo > MAX_A_WIDTH:
        needs[f"A's interval should have narrowed to {A_WIDTH_MARGIN * MAX_A_WIDTH:.2g}"] = (
            spent * ((a_hi - a_lo) / (A_WIDTH_MARGIN * MAX_A_WIDTH)) ** (1.0 / A_WIDTH_SHRINK))
    why, need = max(needs.items(), key=lambda kv: kv[1])
    if need > IDENTIFY_MAX_FACTOR * spent or need <= spent:  # the latter: not identifiable for another reason
        return None, why if need > spent else ""
    return float(need), why


def advise(result: FitResult, spent: float | None = None, target: float | None = None, *,
           min_gain: float = 0.01, identify: bool = True) -> Advice:
    """Scale or stop: predictions at 2x, 4x and 10x the compute spent, compute to reach ``target``, and one
    recommendation.

    * not decidable yet: the fit is not identifiable (the ceiling is an extrapolation); with the compute at which
      it is expected to become identifiable (:func:`compute_to_identify`);
    * stop: the target is reached, the ceiling is below the target (the whole interval on A), or the ceiling is
      reached within noise: even the upper end of the interval of the gain from 10x more compute is below
      ``min_gain`` or the validation noise (the white noise sd of the fit); that interval is the fitted form's,
      without the model discrepancy past the window that the predictions carry (docs/decisions.md);
    * continue: otherwise (the interval of the gain at 10x reaches beyond noise).
    """
    if spent is None:
        spent = float(result.fit_window[1])
    if not math.isfinite(spent) or spent <= 0:
        raise ValueError(f"spent must be a finite compute > 0, got {spent}")
    if target is not None and not 0.0 <= target <= 1.0:
        raise ValueError(f"target must be a pass rate in [0, 1], got {target}")
    preds = [result.prediction(f * spent) for f in ADVICE_FACTORS]
    g = doubling_gain_at(result, spent, ADVICE_FACTORS[-1] * spent)
    to_target = reach(result, target) if target is not None else None
    noise_sd = result.noise[0] if math.isfinite(result.noise[0]) else 0.0
    threshold = max(min_gain, noise_sd)
    now = float(result.predict([spent])[0])
    if not result.identifiable:
        needed, where = _to_identify(result, spent) if identify else (None, "")
        if needed is None and not where:
            more = "a compute this rule cannot estimate"
        elif needed is None:
            more = f"more than {IDENTIFY_MAX_FACTOR:g}x the compute spent ({spent:.4g})"
        else:
            more = (f"about {needed:.4g} compute in all ({needed / spent:.3g}x the {spent:.4g} spent, "
                    f"{needed - spent:.4g} more), where {where}")
        why = next((w for w in result.warnings if "not identifiable" in w), "the fit is not identifiable yet")
        return Advice(spent, preds, g[0], g[1], target, to_target, UNDECIDED,
                      f"{why}; the fit should become identifiable at {more}", needed)
    a_lo, a_hi = result.intervals["A"]
    if target is not None and now >= target:
        rec, why = STOP, f"target {target:.3f} reached: the fit gives {now:.3f} at the compute spent"
    elif target is not None and a_hi < target:
        rec, why = STOP, (f"target {target:.3f} is above the ceiling: A = {result.params['A']:.3f}, "
                          f"{result.level:.0%} interval [{a_lo:.3f}, {a_hi:.3f}]")
    elif g[1][1] < threshold:
        rec, why = STOP, (f"ceiling reached within noise: 10x the compute gains {g[0]:+.4f} "
                          f"({result.level:.0%} interval [{g[1][0]:+.4f}, {g[1][1]:+.4f}]), below "
                          f"{threshold:.4f} (the larger of min_gain and the validation noise)")
    else:
        rec, why = CONTINUE, (f"10x the compute gains {g[0]:+.4f} ({result.level:.0%} interval "
                              f"[{g[1][0]:+.4f}, {g[1][1]:+.4f}]) towards A = {result.params['A']:.3f}")
        if to_target is not None and to_target.compute is not None:
            why += f"; target {target:.3f} at compute {to_target.compute:.4g}"
        elif to_target is not None:
            why += f"; target {target:.3f} {to_target.reason}"
    return Advice(spent, preds, g[0], g[1], target, to_target, rec, why)


def doubling_gain_at(result: FitResult, c0: float, c1: float) -> tuple[float, tuple[float, float]]:
    """R(c1) - R(c0) with its interval at the fit's level."""
    c = np.array([c0, c1], dtype=float)
    v = result.predict(c)
    gain = float(v[1] - v[0])
    ys = result.predict_samples(c)
    if ys is None:
        return gain, (gain, gain)
    d = ys[:, 1] - ys[:, 0]
    d = d[np.isfinite(d)]
    if result.model == "paper" or not d.size:
        iv = (float(d.min()), float(d.max())) if d.size else (gain, gain)
    else:
        q = (1 - result.level) / 2
        iv = (float(np.quantile(d, q)), float(np.quantile(d, 1 - q)))
    return gain, (min(iv[0], gain), max(iv[1], gain))
