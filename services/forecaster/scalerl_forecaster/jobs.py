"""Every job's validation curve and its live fit: points in, a re-fit on each, the fit exported as metrics.

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
from scalerl_forecaster.decisions import compute_to_reach
from scalerl_forecaster.fit import CurveError, FitResult, fit_curve
from scalerl_forecaster.store import PointLog

log = logging.getLogger(__name__)


@dataclass
class JobCurve:
    """One job's points and its latest fit."""

    job_id: str
    recipe: Recipe | None = None
    """The latest recipe sent with a point (None: fit without a budget or a target)."""
    points: dict[int, common_pb2.ValidationPoint] = field(default_factory=dict)
    """By policy version: a re-validated version replaces its point."""
    forecast: forecaster_pb2.Forecast | None = None
    """What GetForecast answers: the latest fit, or why there is none yet."""
    fit: FitResult | None = None
    """The latest successful fit (None when the latest re-fit did not give one)."""
    budget: float = 0.0
    """Compute the fit predicts at: the recipe's budget, else twice the latest point's compute."""

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


def refit(curve: JobCurve) -> None:
    """Fit the curve's points again; sets its forecast, fit and budget."""
    points = curve.sorted_points()
    compute = np.array([p.compute for p in points])
    values = np.array([p.value for p in points])
    out = forecaster_pb2.Forecast(job_id=curve.job_id, num_points=len(points), compute_to_target=-1)
    recipe = curve.recipe
    if recipe is not None and recipe.budget.compute_device_hours:
        curve.budget = recipe.budget.compute_device_hours
    else:
        curve.budget = 2.0 * float(compute.max()) if len(compute) else 0.0
    curve.forecast, curve.fit = out, None
    try:
        result = fit_curve(compute, values, model="sigmoid", min_compute=recipe.forecast.min_compute if recipe else 0.0,
                           level=recipe.forecast.level if recipe else 0.8,
                           predict_at=[curve.budget] if curve.budget > 0 else [])
    except CurveError as err:
        out.warnings.append(f"not fitted yet: {err}")
        return
    except Exception as err:  # a numerical failure must not take the service down
        job_logger(log, curve.job_id).exception("fit failed")
        out.warnings.append(f"fit failed: {err}")
        return
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
    curve.fit = result


class Forecasts:
    """All jobs' curves, kept in memory and (with `state_dir`) in a PointLog that a restart replays."""

    def __init__(self, state_dir: Path | None = None):
        self.log = PointLog(state_dir) if state_dir is not None else None
        self.jobs: dict[str, JobCurve] = {}
        self.lock = threading.Lock()
        self.exported: set[str] = set()
        if self.log is not None:
            for point, recipe_json in self.log.replay():
                self._store(point, recipe_of(recipe_json, point.job_id))
            for curve in self.jobs.values():  # one fit per job, not one per restored point
                self._refit(curve)

    def add_point(self, point: common_pb2.ValidationPoint, recipe_json: str = "") -> forecaster_pb2.Forecast:
        """Store a point (and the recipe sent with it), re-fit its job -> the new forecast."""
        check_point(point)
        recipe = recipe_of(recipe_json, point.job_id)
        with self.lock:
            curve = self._store(point, recipe)
            if self.log is not None:
                self.log.append(point, recipe_json)
            self._refit(curve)
            return curve.forecast

    def forecast(self, job_id: str) -> forecaster_pb2.Forecast:
        """The job's latest forecast; an empty one for a job without points."""
        with self.lock:
            curve = self.jobs.get(job_id)
            return curve.forecast if curve else forecaster_pb2.Forecast(job_id=job_id)

    def points(self, job_id: str) -> list[common_pb2.ValidationPoint]:
        """The job's points sorted by compute; none for an unknown job."""
        with self.lock:
            curve = self.jobs.get(job_id)
            return curve.sorted_points() if curve else []

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

    def _store(self, point: common_pb2.ValidationPoint, recipe: Recipe | None) -> JobCurve:
        curve = self.jobs.setdefault(point.job_id, JobCurve(point.job_id))
        if recipe is not None:
            curve.recipe = recipe  # the latest recipe sent wins (e.g. the first points came without one)
        curve.points[point.policy_version] = point
        return curve

    def _refit(self, curve: JobCurve) -> None:
        refit(curve)
        metrics.export(curve)
        self.exported.add(curve.job_id)
