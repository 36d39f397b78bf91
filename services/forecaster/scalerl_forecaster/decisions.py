"""Decisions from fitted curves: value at a budget, compute to reach a target, doubling gain, comparisons."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .fit import FitResult, Prediction

__all__ = [
    "predict_at",
    "compute_to_reach",
    "reach",
    "Reach",
    "doubling_gain",
    "DoublingGain",
    "compare",
    "Comparison",
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
    interval: tuple[float, float] | None  # None when the target is unreachable for the point estimate
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
        ok = (s > 0) & (s < 1)
        out = np.where(ok, third / ((1.0 / s - 1.0) ** (1.0 / B)), np.nan)
        out = np.where(np.isfinite(s) & (s <= 0), 0.0, out)
        return out


def reach(result: FitResult, target: float) -> Reach:
    """Compute needed to reach ``target`` (with an interval from the bootstrap), or None + reason."""
    if not (0.0 <= target <= 1.0):
        raise ValueError(f"target must be a pass rate in [0, 1], got {target}")
    p = result.params
    third = p["D"] if result.model == "power" else p["C_mid"]
    A = p["A"]
    if result.model != "power" and target <= p["R0"]:
        return Reach(target, 0.0, (0.0, 0.0), f"already reached: R0 = {p['R0']:.3f} >= target")
    if target >= A:
        return Reach(
            target, None, None,
            f"not reachable: ceiling below target (A = {A:.3f}, {result.level:.0%} interval "
            f"[{result.intervals['A'][0]:.3f}, {result.intervals['A'][1]:.3f}] vs target {target:.3f})",
        )
    c = float(_inverse(result.model, A, p["B"], third, p["R0"], target))
    interval = None
    reason = "reachable"
    if result.samples is not None and len(result.samples):
        s = result.samples
        cs = _inverse(result.model, s[:, 0], s[:, 1], s[:, 2], s[:, 3], target)
        cs = np.where(np.isnan(cs), np.inf, cs)  # unreachable replicate: infinite compute
        if result.model == "paper":
            lo, hi = float(np.min(cs)), float(np.max(cs))
        else:
            q = (1 - result.level) / 2
            lo, hi = float(np.quantile(cs, q)), float(np.quantile(cs, 1 - q))
        interval = (min(lo, c), max(hi, c))
        frac_unreach = float(np.mean(~np.isfinite(cs)))
        if frac_unreach > 0:
            reason = f"reachable, but {frac_unreach:.0%} of bootstrap curves never reach it"
    if not result.identifiable:
        reason += " (curve not identifiable yet: treat as a rough guess)"
    return Reach(target, c, interval, reason)


def compute_to_reach(result: FitResult, target: float) -> float | None:
    """Compute needed to reach ``target``; None when the fitted ceiling A is at or below the target.

    Use :func:`reach` for the interval and the reason.
    """
    return reach(result, target).compute


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
    more_efficient: str | None  # by higher B / lower C_mid
    verdict: str  # "ceiling mover", "efficiency shaper", "both", "no difference beyond noise"
    summary: str
    notes: list[str] = field(default_factory=list)


def _diff(name: str, ra: FitResult, rb: FitResult, idx: int, level: float, log: bool = False) -> ParamDiff:
    a, b = ra.params[name], rb.params[name]
    tf = np.log if log else (lambda z: z)
    d = float(tf(b) - tf(a))
    sa, sb = ra.samples, rb.samples
    if sa is not None and sb is not None and len(sa) and len(sb) and ra.model != "paper" and rb.model != "paper":
        m = min(len(sa), len(sb))
        with np.errstate(divide="ignore", invalid="ignore"):
            # independent runs -> pair replicates at random (they are independent draws already)
            ds = tf(sb[:m, idx]) - tf(sa[:m, idx])
        ds = ds[np.isfinite(ds)]
        q = (1 - level) / 2
        lo, hi = float(np.quantile(ds, q)), float(np.quantile(ds, 1 - q))
    else:  # envelope / intervals only: conservative difference of intervals
        la, ha = (tf(v) for v in ra.intervals[name])
        lb, hb = (tf(v) for v in rb.intervals[name])
        lo, hi = float(lb - ha), float(hb - la)
    lo, hi = min(lo, d), max(hi, d)
    return ParamDiff(name, float(a), float(b), d, (lo, hi), bool(lo > 0 or hi < 0))


COMPARE_LEVEL = 0.95


def compare(ra: FitResult, rb: FitResult, *, level: float = COMPARE_LEVEL) -> Comparison:
    """Compare two fitted curves (a vs b): is one ceiling higher beyond noise, which is more efficient.

    Ceiling movers change A; efficiency shapers change B / C_mid at (statistically) the same A.
    "Beyond noise" means the ``level`` (default 95%) bootstrap interval of the difference excludes 0;
    three parameters are tested, so a lower level would flag spurious differences too often.
    """
    if ra.model == "power" or rb.model == "power":
        raise ValueError("compare needs sigmoid (or paper) fits, not power-law fits")
    lv = level
    dA = _diff("A", ra, rb, 0, lv)
    dB = _diff("B", ra, rb, 1, lv)
    dC = _diff("C_mid", ra, rb, 2, lv, log=True)
    higher = None
    if dA.significant:
        higher = "b" if dA.diff > 0 else "a"
    eff_votes = []
    if dB.significant:
        eff_votes.append("b" if dB.diff > 0 else "a")
    if dC.significant:
        eff_votes.append("b" if dC.diff < 0 else "a")
    more_eff = eff_votes[0] if eff_votes and all(v == eff_votes[0] for v in eff_votes) else None
    notes = []
    if len(set(eff_votes)) > 1:
        notes.append("B and C_mid point in opposite directions (higher B but later midpoint)")
    if not (ra.identifiable and rb.identifiable):
        notes.append("at least one curve is not identifiable yet; differences are uncertain")
    if higher and eff_votes:
        verdict = "both"
    elif higher:
        verdict = "ceiling mover"
    elif eff_votes:
        verdict = "efficiency shaper"
    else:
        verdict = "no difference beyond noise"
    parts = [
        f"A: a={dA.a:.3f} b={dA.b:.3f} (b-a {dA.diff:+.3f}, {lv:.0%} [{dA.interval[0]:+.3f}, {dA.interval[1]:+.3f}])"
        + (f" -> higher ceiling: {higher}" if higher else " -> same ceiling within noise"),
        f"B: a={dB.a:.2f} b={dB.b:.2f} (b-a {dB.diff:+.2f}, [{dB.interval[0]:+.2f}, {dB.interval[1]:+.2f}])"
        + (" significant" if dB.significant else ""),
        f"C_mid: a={dC.a:.4g} b={dC.b:.4g} (ratio b/a {math.exp(dC.diff):.2f}, "
        f"[{math.exp(dC.interval[0]):.2f}, {math.exp(dC.interval[1]):.2f}])"
        + (" significant" if dC.significant else ""),
        f"verdict: {verdict}" + (f"; more efficient: {more_eff}" if more_eff else ""),
    ]
    return Comparison(dA, dB, dC, higher, more_eff, verdict, "\n".join(parts), notes)
