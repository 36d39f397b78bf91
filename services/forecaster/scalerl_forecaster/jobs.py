"""Every job's validation curve and its live fit: points in, a re-fit on each, the fit exported as metrics.

A fit runs outside the lock that guards the curves (a GPU run's curve of thousands of points takes seconds to
fit), one at a time per curve: reads answer the latest installed fit at once, other curves fit meanwhile, and
points that arrive while their curve is being fitted share the next fit.

Knows nothing of gRPC: bad input raises `scalerl.errors` classes, which the server's interceptor maps.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from scalerl import errors
from scalerl.logs import job_logger
from scalerl.recipe import Recipe, parse_recipe
from scalerl.v1 import common_pb2, forecaster_pb2
from scalerl_forecaster import metrics
from scalerl_forecaster import decisions
from scalerl_forecaster.decisions import Advice, advise, compute_to_reach
from scalerl_forecaster.correlation import spearman
from scalerl_forecaster.fit import MODEL_DISCREPANCY, CurveError, FitResult, fit_curve
from scalerl_forecaster.store import PointLog

log = logging.getLogger(__name__)

IID = "iid"
"""The iid validation split's curve; downstream eval sets have curves of their own beside it."""


def set_name(eval_set: str) -> str:
    """The request's eval set: empty is iid; a name must be one a recipe may give (InvalidArgument otherwise)."""
    if not eval_set:
        return IID
    if len(eval_set) > 64 or not all(ch.isalnum() or ch in "_.-/" for ch in eval_set):
        raise errors.InvalidArgument(f"{eval_set!r} is not an eval set name", field="eval_set")
    return eval_set


@dataclass(frozen=True)
class Fitted:
    """One fit of a curve's points, as installed on the curve."""

    forecast: forecaster_pb2.Forecast
    """What GetForecast answers: the fit, or why there is none."""
    fit: FitResult | None
    """None when the points did not give a fit."""
    budget: float
    """Compute the fit predicts at: the recipe's budget, else twice the latest point's compute."""
    recipe: Recipe | None
    """The recipe the fit was made with (a point that arrived during the fit may have brought a newer one)."""


@dataclass
class JobCurve:
    """One job's points and its latest fit."""

    job_id: str
    eval_set: str = IID
    """"iid" (the validation split) or a downstream eval set of the recipe's validation.eval_sets."""
    recipe: Recipe | None = None
    """The latest recipe sent with a point (None: fit without a budget or a target)."""
    points: dict[int, common_pb2.ValidationPoint] = field(default_factory=dict)
    """By policy version: a re-validated version replaces its point."""
    fitted: Fitted | None = None
    """The latest installed fit (None until the first one ends)."""
    revision: int = 0
    """Points stored so far, a re-validated version counted again: the fit that covers them is this revision's."""
    fitted_revision: int = -1
    """The revision the installed forecast was fitted on."""
    fitting: bool = False
    """A fit of this curve is running outside the lock; the next one waits for it."""

    def sorted_points(self) -> list[common_pb2.ValidationPoint]:
        return sorted(self.points.values(), key=lambda p: (p.compute, p.policy_version))


def check_point(point: common_pb2.ValidationPoint) -> None:
    if not point.job_id:
        raise errors.InvalidArgument("is required", field="point.job_id")
    if not 0.0 <= point.value <= 1.0:
        raise errors.InvalidArgument(f"{point.value} is outside [0, 1]", field="point.value", job_id=point.job_id)
    if not math.isfinite(point.compute) or point.compute < 0:
        raise errors.InvalidArgument(f"{point.compute} must be a finite number >= 0", field="point.compute",
                                     job_id=point.job_id)


def recipe_of(recipe_json: str, job_id: str) -> Recipe | None:
    """The recipe sent with a point (None when none was sent); InvalidArgument naming the field when invalid."""
    if not recipe_json:
        return None
    try:
        return parse_recipe(recipe_json)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise errors.InvalidArgument(first["msg"], field=f"recipe_json.{where}" if where else "recipe_json",
                                     job_id=job_id) from None


def fit_forecast(job_id: str, eval_set: str, points: list[common_pb2.ValidationPoint],
                 recipe: Recipe | None) -> Fitted:
    """Fit the points (sorted by compute) -> the forecast GetForecast answers, the fit and the budget."""
    compute = np.array([p.compute for p in points])
    values = np.array([p.value for p in points])
    out = forecaster_pb2.Forecast(job_id=job_id, num_points=len(points), compute_to_target=-1)
    if recipe is not None and recipe.budget.compute_device_hours:
        budget = recipe.budget.compute_device_hours
    else:
        budget = 2.0 * float(compute.max()) if len(compute) else 0.0
    try:
        result = fit_curve(compute, values, model="sigmoid", min_compute=recipe.forecast.min_compute if recipe else 0.0,
                           level=recipe.forecast.level if recipe else 0.8,
                           discrepancy=recipe.forecast.model_discrepancy if recipe else MODEL_DISCREPANCY,
                           predict_at=[budget] if budget > 0 else [])
    except CurveError as err:
        out.warnings.append(f"not fitted yet: {err}")
        return Fitted(out, None, budget, recipe)
    except Exception as err:  # a numerical failure must not take the service down
        job_logger(log, job_id).exception("fit failed")
        out.warnings.append(f"fit failed: {err}")
        return Fitted(out, None, budget, recipe)
    p = result.params
    out.model, out.a, out.b, out.c_mid, out.r0 = result.model, p["A"], p["B"], p["C_mid"], p["R0"]
    for name, (lo, hi) in result.intervals.items():
        out.intervals[name].lo, out.intervals[name].hi = lo, hi
    for pred in result.predictions:
        out.predictions.add(compute=pred.compute, value=pred.value,
                            interval=forecaster_pb2.Interval(lo=pred.interval[0], hi=pred.interval[1]))
    out.identifiable = result.identifiable
    out.warnings.extend(result.warnings)
    if recipe is not None and recipe.budget.target_pass_rate is not None:
        needed = compute_to_reach(result, recipe.budget.target_pass_rate)
        out.compute_to_target = -1 if needed is None else needed
    if eval_set != IID:
        return Fitted(out, result, budget, recipe)  # the advice is about the job's iid curve
    try:
        out.decision.CopyFrom(decision_of(job_id, result, recipe, None))
    except Exception:  # advice is extra: a numerical failure keeps the fit
        job_logger(log, job_id).exception("advice failed")
    return Fitted(out, result, budget, recipe)


def decision_of(job_id: str, fit: FitResult, recipe: Recipe | None, target: float | None) -> forecaster_pb2.Decision:
    """Scale-or-stop advice from a fit, at the compute its points reach (the recipe's target unless `target` is
    given)."""
    if target is None and recipe is not None:
        target = recipe.budget.target_pass_rate
    min_gain = recipe.forecast.stop_below_gain if recipe is not None else 0.01
    return advice_pb(job_id, advise(fit, None, target, min_gain=min_gain), fit)


def advice_pb(job_id: str, a: Advice, fit: FitResult) -> forecaster_pb2.Decision:
    out = forecaster_pb2.Decision(
        job_id=job_id, spent=a.spent, gain=a.gain, gain_interval=forecaster_pb2.Interval(lo=a.gain_interval[0],
                                                                                         hi=a.gain_interval[1]),
        target=-1 if a.target is None else a.target, compute_to_target=-1, recommendation=a.recommendation,
        reason=a.reason, compute_to_identify=-1 if a.compute_to_identify is None else a.compute_to_identify,
        identifiable=fit.identifiable, level=fit.level)
    for pred in a.predictions:
        out.predictions.add(compute=pred.compute, value=pred.value,
                            interval=forecaster_pb2.Interval(lo=pred.interval[0], hi=pred.interval[1]))
    if a.to_target is not None:
        if a.to_target.compute is not None:
            out.compute_to_target = a.to_target.compute
        if a.to_target.interval is not None:  # also beside no point: where the band reaches a target past A
            out.compute_to_target_interval.lo, out.compute_to_target_interval.hi = a.to_target.interval
    return out


COMPARE_SEEDS = (101, 202)
"""Bootstrap seeds of the two refits a comparison makes: independent replicates (the live fits share seed 0)."""
COMPARE_BAND_POINTS = 64


def _describe(recipe: Recipe | None) -> tuple[str, str] | None:
    if recipe is None:
        return None
    return recipe.model.path, recipe.task.model_dump_json()


class Forecasts:
    """All jobs' curves, kept in memory and (with `state_dir`) in a PointLog that a restart replays."""

    def __init__(self, state_dir: Path | None = None):
        self.log = PointLog(state_dir) if state_dir is not None else None
        self.jobs: dict[str, JobCurve] = {}
        """The iid validation curve of each job."""
        self.sets: dict[tuple[str, str], JobCurve] = {}
        """(job id, eval set) -> the downstream eval set's curve."""
        self.lock = threading.Lock()
        """Guards the curves; never held while fitting."""
        self.fitted = threading.Condition(self.lock)
        """Notified when a curve's fit ends."""
        self.exported: set[str] = set()
        if self.log is not None:
            for point, recipe_json, eval_set in self.log.replay():
                self._store(point, recipe_of(recipe_json, point.job_id), eval_set)
            for curve in [*self.jobs.values(), *self.sets.values()]:  # one fit per curve, not one per point
                self._fit_to(curve, curve.revision)

    def add_point(self, point: common_pb2.ValidationPoint, recipe_json: str = "",
                  eval_set: str = "") -> forecaster_pb2.Forecast:
        """Store a point (and the recipe sent with it) on the curve of `eval_set` (empty: iid validation), re-fit
        that curve -> its new forecast, fitted on this point and any that arrived with it."""
        check_point(point)
        name = set_name(eval_set)
        recipe = recipe_of(recipe_json, point.job_id)
        with self.lock:
            curve = self._store(point, recipe, name)
            if self.log is not None:
                self.log.append(point, recipe_json, name)
            revision = curve.revision
        return self._fit_to(curve, revision)

    def _fit_to(self, curve: JobCurve, revision: int) -> forecaster_pb2.Forecast:
        """Wait until the curve's installed fit covers `revision` -> that forecast. The caller fits, outside the
        lock, unless a fit of the curve is running; then it waits, and a running fit that began before `revision`
        is followed by one fit of every point stored meanwhile (by whichever waiter wakes first)."""
        with self.lock:
            while curve.fitted_revision < revision:
                if curve.fitting:
                    self.fitted.wait()
                    continue
                covers, points, recipe = curve.revision, curve.sorted_points(), curve.recipe
                curve.fitting = True
                self.lock.release()
                try:
                    fitted = fit_forecast(curve.job_id, curve.eval_set, points, recipe)
                finally:
                    self.lock.acquire()
                    curve.fitting = False
                    self.fitted.notify_all()
                curve.fitted, curve.fitted_revision = fitted, covers
                self._export(curve)
            return curve.fitted.forecast

    def _curve(self, job_id: str, eval_set: str) -> JobCurve | None:
        name = set_name(eval_set)
        return self.jobs.get(job_id) if name == IID else self.sets.get((job_id, name))

    def forecast(self, job_id: str, eval_set: str = "") -> forecaster_pb2.Forecast:
        """The latest installed forecast of the job's curve (iid unless `eval_set`); an empty one for a curve without
        points, or whose first fit is still running."""
        with self.lock:
            curve = self._curve(job_id, eval_set)
            if curve is None:
                return forecaster_pb2.Forecast(job_id=job_id)
            if curve.fitted is None:
                why = "the first fit is running" if curve.fitting else "the first fit did not finish"
                return forecaster_pb2.Forecast(job_id=job_id, num_points=len(curve.points), compute_to_target=-1,
                                               warnings=[f"not fitted yet: {why}"])
            return curve.fitted.forecast

    def points(self, job_id: str, eval_set: str = "") -> list[common_pb2.ValidationPoint]:
        """The curve's points sorted by compute; none for an unknown job or set."""
        with self.lock:
            curve = self._curve(job_id, eval_set)
            return curve.sorted_points() if curve else []

    def eval_sets(self, job_id: str) -> list[str]:
        """The job's curves: "iid" (when it has iid points) and its downstream sets, by name."""
        with self.lock:
            names = sorted(name for (job, name) in self.sets if job == job_id)
            return ([IID] if job_id in self.jobs else []) + names

    def correlations(self, job_id: str, level: float = 0.95) -> forecaster_pb2.Correlations:
        """Spearman correlation of each downstream set with iid validation over the versions both measured."""
        if not 0.0 < level < 1.0:
            raise errors.InvalidArgument(f"{level} is outside (0, 1)", field="level", job_id=job_id)
        with self.lock:
            iid = self.jobs.get(job_id)
            sets = sorted((name, curve) for (job, name), curve in self.sets.items() if job == job_id)
            if iid is None and not sets:
                raise errors.NotFound(f"no validation points for job {job_id!r}", field="job_id", job_id=job_id)
            iid_points = dict(iid.points) if iid is not None else {}
            set_points = [(name, dict(curve.points)) for name, curve in sets]
        out = forecaster_pb2.Correlations(job_id=job_id, level=level)
        for name, points in set_points:
            shared = sorted(set(points) & set(iid_points))
            r = spearman([iid_points[v].value for v in shared], [points[v].value for v in shared], level)
            out.sets.add(eval_set=name, num_versions=r.n, spearman=r.rho, enough_points=r.enough, note=r.note,
                         interval=forecaster_pb2.Interval(lo=r.interval[0], hi=r.interval[1]))
        return out

    def decision(self, job_id: str, target: float | None = None) -> forecaster_pb2.Decision:
        """Scale-or-stop advice of the job's latest fit (at `target`, else its recipe's target)."""
        if target is not None and not 0.0 <= target <= 1.0:
            raise errors.InvalidArgument(f"{target} is outside [0, 1]", field="target", job_id=job_id)
        with self.lock:
            fitted = self._curve_with_fit(job_id, "job_id").fitted
        if target is None and fitted.forecast.HasField("decision"):
            return fitted.forecast.decision
        return decision_of(job_id, fitted.fit, fitted.recipe, target)

    def compare(self, job_ids: list[str], level: float = decisions.COMPARE_LEVEL) -> forecaster_pb2.Comparison:
        """Two jobs' curves refitted side by side at `level` and the verdict (see `decisions.compare`)."""
        if len(job_ids) != 2 or job_ids[0] == job_ids[1]:
            raise errors.InvalidArgument(f"compare needs exactly two different job ids, got {list(job_ids)}",
                                         field="job_ids")
        if not 0.0 < level < 1.0:
            raise errors.InvalidArgument(f"{level} is outside (0, 1)", field="level")
        with self.lock:
            curves = [self._curve_with_fit(j, f"job_ids[{i}]") for i, j in enumerate(job_ids)]
            data = [(c.job_id, c.recipe, c.sorted_points()) for c in curves]
        fits = []
        for (job_id, recipe, points), seed in zip(data, COMPARE_SEEDS):
            min_compute = recipe.forecast.min_compute if recipe else 0.0
            fits.append(fit_curve([p.compute for p in points], [p.value for p in points], model="sigmoid",
                                  min_compute=min_compute, level=level, seed=seed))
        cmp = decisions.compare(fits[0], fits[1], level=level)
        out = forecaster_pb2.Comparison(level=level, verdict=cmp.verdict, summary=cmp.summary,
                                        ceiling_p=cmp.ceiling_p, efficiency_p=cmp.efficiency_p)
        by_letter = {"a": job_ids[0], "b": job_ids[1]}
        out.higher_ceiling = by_letter.get(cmp.higher_ceiling, "")
        out.more_efficient = by_letter.get(cmp.more_efficient, "")
        out.notes.extend(cmp.notes)
        for d in (cmp.A, cmp.B, cmp.C_mid):
            out.params.add(name=d.name, a=d.a, b=d.b, diff=d.diff, significant=d.significant,
                           interval=forecaster_pb2.Interval(lo=d.interval[0], hi=d.interval[1]))
        (ja, ra, _), (jb, rb, _) = data
        da, db = _describe(ra), _describe(rb)
        if da is None or db is None:
            out.warnings.append("a job's recipe is unknown to the forecaster: cannot tell whether the jobs train the "
                                "same model on the same task")
        else:
            if da[0] != db[0]:
                out.warnings.append(f"different models: {ja} trains {da[0]}, {jb} trains {db[0]}; the verdict "
                                    "compares the curves, not one recipe change")
            if da[1] != db[1]:
                out.warnings.append(f"different tasks: {ja} and {jb} validate on different task settings, so their "
                                    "pass rates are not on the same scale")
        grid_end = max(f.fit_window[1] for f in fits) * 2.0
        grid = np.linspace(0.0, grid_end, COMPARE_BAND_POINTS)
        for (job_id, _, points), fit in zip(data, fits):
            job = out.jobs.add(job_id=job_id)
            job.points.extend(points)
            f = job.forecast
            p = fit.params
            f.job_id, f.model, f.num_points = job_id, fit.model, len(points)
            f.a, f.b, f.c_mid, f.r0, f.identifiable = p["A"], p["B"], p["C_mid"], p["R0"], fit.identifiable
            for name, (lo, hi) in fit.intervals.items():
                f.intervals[name].lo, f.intervals[name].hi = lo, hi
            f.warnings.extend(fit.warnings)
            lower, upper = fit.predict_interval(grid)
            job.band.compute.extend(grid.tolist())
            job.band.fit.extend(fit.predict(grid).tolist())
            job.band.lower.extend(lower.tolist())
            job.band.upper.extend(upper.tolist())
        return out

    def _curve_with_fit(self, job_id: str, field_name: str) -> JobCurve:
        curve = self.jobs.get(job_id)
        if curve is None or not curve.points:
            raise errors.NotFound(f"no validation points for job {job_id!r}", field=field_name, job_id=job_id)
        if curve.fitted is None or curve.fitted.fit is None:
            why = "; ".join(curve.fitted.forecast.warnings) if curve.fitted is not None else "not fitted"
            raise errors.FailedPrecondition(f"job {job_id!r} has no fit yet ({len(curve.points)} points): {why}",
                                            field=field_name, job_id=job_id)
        return curve

    def export_only(self, active_job_id: str | None) -> None:
        """Keep the metrics of the active job only: an ended job's series go (its alerts resolve), its points stay.
        A job that becomes active again is exported again."""
        with self.lock:
            for job_id, curve in self.jobs.items():
                if job_id == active_job_id and job_id not in self.exported:
                    metrics.export(curve)
                    self.exported.add(job_id)
                elif job_id != active_job_id and job_id in self.exported:
                    metrics.forget_job(job_id)
                    self.exported.discard(job_id)

    def _store(self, point: common_pb2.ValidationPoint, recipe: Recipe | None, eval_set: str = IID) -> JobCurve:
        if eval_set == IID:
            curve = self.jobs.setdefault(point.job_id, JobCurve(point.job_id))
        else:
            curve = self.sets.setdefault((point.job_id, eval_set), JobCurve(point.job_id, eval_set))
        if recipe is not None:
            curve.recipe = recipe  # the latest recipe sent wins (e.g. the first points came without one)
        curve.points[point.policy_version] = point
        curve.revision += 1
        return curve

    def _export(self, curve: JobCurve) -> None:
        if curve.eval_set != IID:
            metrics.export_set(curve)
            return
        metrics.export(curve)
        self.exported.add(curve.job_id)
