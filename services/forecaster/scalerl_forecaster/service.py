"""Forecaster gRPC service: stores validation points per job, re-fits on each, exports the fit as metrics."""

from __future__ import annotations

import json
import logging
import math
import threading
from pathlib import Path
from urllib.parse import quote

import grpc
import numpy as np
from google.protobuf import json_format
from prometheus_client import Gauge

from scalerl.recipe import Recipe, parse_recipe
from scalerl.v1 import common_pb2, forecaster_pb2, forecaster_pb2_grpc

log = logging.getLogger(__name__)

CURVE_POINTS = 64
POINTS = Gauge("scalerl_forecaster_points", "Validation points received", ["job_id"])
PARAM = Gauge("scalerl_forecaster_fit_param", "Fitted sigmoid parameter", ["job_id", "param"])
PARAM_LO = Gauge("scalerl_forecaster_fit_param_lower", "Lower interval bound of a fitted parameter",
                 ["job_id", "param"])
PARAM_HI = Gauge("scalerl_forecaster_fit_param_upper", "Upper interval bound of a fitted parameter",
                 ["job_id", "param"])
PREDICTED = Gauge("scalerl_forecaster_predicted_pass_rate", "Predicted pass rate at the job's budget", ["job_id"])
TO_TARGET = Gauge("scalerl_forecaster_compute_to_target_device_hours",
                  "Compute to reach the job's target pass rate (-1: not reachable)", ["job_id"])
TARGET = Gauge("scalerl_forecaster_target_pass_rate", "The job's target pass rate", ["job_id"])
IDENTIFIABLE = Gauge("scalerl_forecaster_identifiable", "1 when the fit is identifiable", ["job_id"])
LAST_VALUE = Gauge("scalerl_forecaster_validation_pass_rate", "Latest validation pass rate", ["job_id"])
LAST_COMPUTE = Gauge("scalerl_forecaster_validation_compute_device_hours", "Compute of the latest point",
                     ["job_id"])
CURVE_VALUE = Gauge("scalerl_forecaster_curve_pass_rate", "Fitted curve and band sampled to the budget",
                    ["job_id", "point", "kind"])
CURVE_COMPUTE = Gauge("scalerl_forecaster_curve_compute_device_hours", "Compute of each sampled curve point",
                      ["job_id", "point"])


class JobCurve:
    def __init__(self, job_id: str, recipe: Recipe | None):
        self.job_id = job_id
        self.recipe = recipe
        self.points: dict[int, common_pb2.ValidationPoint] = {}
        self.forecast = forecaster_pb2.Forecast(job_id=job_id)

    def sorted_points(self) -> list[common_pb2.ValidationPoint]:
        return sorted(self.points.values(), key=lambda p: (p.compute, p.policy_version))


class ForecasterService(forecaster_pb2_grpc.ForecasterServicer):
    def __init__(self, state_dir: Path | None = None, recipes: dict[str, str] | None = None):
        self.state_dir = state_dir
        self.jobs: dict[str, JobCurve] = {}
        self.lock = threading.Lock()
        if state_dir is not None:
            state_dir.mkdir(parents=True, exist_ok=True)
            self._restore()

    def _restore(self) -> None:
        for path in sorted(self.state_dir.glob("*.jsonl")):
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                record = json.loads(line)
                self._add(json_format.ParseDict(record["point"], common_pb2.ValidationPoint()),
                          record.get("recipe_json", ""), persist=False, fit=False)
        for curve in self.jobs.values():  # one fit per job, not one per restored point
            curve.forecast = refit(curve)
            export_metrics(curve)

    def _state_file(self, job_id: str) -> Path:
        # the job id is user input: never let it name a path outside state_dir
        return self.state_dir / f"{quote(job_id, safe='')}.jsonl"

    def _add(self, point: common_pb2.ValidationPoint, recipe_json: str, persist: bool = True,
             fit: bool = True) -> JobCurve:
        recipe = parse_recipe(recipe_json) if recipe_json else None
        curve = self.jobs.get(point.job_id)
        if curve is None:
            curve = self.jobs[point.job_id] = JobCurve(point.job_id, recipe)
        elif recipe is not None:
            curve.recipe = recipe  # the latest recipe sent wins (e.g. the first points came without one)
        curve.points[point.policy_version] = point
        if persist and self.state_dir is not None:
            with open(self._state_file(point.job_id), "a") as f:
                f.write(json.dumps({"point": json_format.MessageToDict(point), "recipe_json": recipe_json}) + "\n")
        if fit:
            curve.forecast = refit(curve)
            export_metrics(curve)
        return curve

    def AddPoint(self, request, context):
        if not request.job_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job_id is required")
        if not 0.0 <= request.value <= 1.0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"value: {request.value} is outside [0, 1]")
        if not math.isfinite(request.compute) or request.compute < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"compute: {request.compute} must be a finite number >= 0")
        recipe_json = dict(context.invocation_metadata()).get("scalerl-recipe-json", "")
        if recipe_json:
            try:
                parse_recipe(recipe_json)
            except ValueError as err:  # pydantic.ValidationError is a ValueError
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"scalerl-recipe-json: invalid recipe: {err}")
        with self.lock:
            return self._add(request, recipe_json).forecast

    def GetForecast(self, request, context):
        with self.lock:
            curve = self.jobs.get(request.job_id)
            return curve.forecast if curve else forecaster_pb2.Forecast(job_id=request.job_id)

    def GetCurve(self, request, context):
        with self.lock:
            curve = self.jobs.get(request.job_id)
            return forecaster_pb2.Curve(job_id=request.job_id, points=curve.sorted_points() if curve else [])


def _budget(curve: JobCurve, latest_compute: float) -> float:
    if curve.recipe is not None and curve.recipe.budget.compute_device_hours:
        return curve.recipe.budget.compute_device_hours
    return 2.0 * latest_compute


def refit(curve: JobCurve) -> forecaster_pb2.Forecast:
    from scalerl_forecaster.decisions import compute_to_reach
    from scalerl_forecaster.fit import CurveError, fit_curve

    points = curve.sorted_points()
    compute = np.array([p.compute for p in points])
    values = np.array([p.value for p in points])
    out = forecaster_pb2.Forecast(job_id=curve.job_id, num_points=len(points), compute_to_target=-1)
    recipe = curve.recipe
    min_compute = recipe.forecast.min_compute if recipe else 0.0
    level = recipe.forecast.level if recipe else 0.8
    budget = _budget(curve, float(compute.max()) if len(compute) else 0.0)
    try:
        result = fit_curve(compute, values, model="sigmoid", min_compute=min_compute, level=level,
                           predict_at=[budget] if budget > 0 else [])
    except CurveError as err:
        out.warnings.append(f"not fitted yet: {err}")
        return out
    except Exception as err:  # a numerical failure must not take the service down
        log.exception("fit failed for job %s", curve.job_id)
        out.warnings.append(f"fit failed: {err}")
        return out
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
    curve.fit_result = result
    curve.budget = budget
    return out


def export_metrics(curve: JobCurve) -> None:
    job, f = curve.job_id, curve.forecast
    points = curve.sorted_points()
    POINTS.labels(job).set(len(points))
    if points:
        LAST_VALUE.labels(job).set(points[-1].value)
        LAST_COMPUTE.labels(job).set(points[-1].compute)
    if curve.recipe is not None and curve.recipe.budget.target_pass_rate is not None:
        TARGET.labels(job).set(curve.recipe.budget.target_pass_rate)
    if not f.model:
        IDENTIFIABLE.labels(job).set(0)
        return
    for name, value in (("A", f.a), ("B", f.b), ("C_mid", f.c_mid), ("R0", f.r0)):
        PARAM.labels(job, name).set(value)
        if name in f.intervals:
            PARAM_LO.labels(job, name).set(f.intervals[name].lo)
            PARAM_HI.labels(job, name).set(f.intervals[name].hi)
    IDENTIFIABLE.labels(job).set(1 if f.identifiable else 0)
    if f.predictions:
        PREDICTED.labels(job).set(f.predictions[-1].value)
    TO_TARGET.labels(job).set(f.compute_to_target)
    result = getattr(curve, "fit_result", None)
    if result is not None:
        grid = np.linspace(0.0, curve.budget, CURVE_POINTS)
        band = band_of(result, grid)
        fit_values = result.predict(grid)
        for i, c in enumerate(grid):
            CURVE_COMPUTE.labels(job, str(i)).set(float(c))
            CURVE_VALUE.labels(job, str(i), "fit").set(float(fit_values[i]))
            CURVE_VALUE.labels(job, str(i), "lower").set(band[i][0])
            CURVE_VALUE.labels(job, str(i), "upper").set(band[i][1])


def band_of(result, grid) -> list[tuple[float, float]]:
    lo, hi = result.predict_interval(grid)
    return [(float(a), float(b)) for a, b in zip(lo, hi)]


def main(settings) -> None:
    from scalerl.serving import ServiceRegistration, run_service

    service = ForecasterService(state_dir=Path(settings.data_dir) / "forecaster")
    registration = ServiceRegistration(
        ["scalerl.v1.Forecaster"], lambda s: forecaster_pb2_grpc.add_ForecasterServicer_to_server(service, s))
    run_service(settings, registration)
