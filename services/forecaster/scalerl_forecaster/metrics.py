"""Prometheus gauges of the forecaster: each job's points, fitted parameters and the curve for Grafana."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from prometheus_client import Gauge

from scalerl.metrics import remove_job_series

if TYPE_CHECKING:
    from scalerl_forecaster.jobs import JobCurve

CURVE_POINTS = 64
"""Samples of the fitted curve and its band, from compute 0 to the budget."""
POINTS_SHOWN = 256
"""Most measured points exported per job: a longer curve (a GPU run validated every few steps) is shown by this many
of its points, evenly spread by index from the first to the last, so the series per job stay bounded."""

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
RECOMMENDATION = Gauge("scalerl_forecaster_recommendation",
                       "Scale-or-stop advice: 1 for the current recommendation, 0 for the others", ["job_id", "recommendation"])
ADVICE_VALUE = Gauge("scalerl_forecaster_advice_pass_rate",
                     "Predicted pass rate at a multiple of the compute spent (kind: fit, lower, upper)",
                     ["job_id", "factor", "kind"])
TO_IDENTIFY = Gauge("scalerl_forecaster_compute_to_identify_device_hours",
                    "Compute at which the fit should become identifiable (-1: decidable now or unknown)", ["job_id"])
RECOMMENDATIONS = ("continue", "stop", "not decidable yet")
SET_VALUE = Gauge("scalerl_forecaster_eval_set_pass_rate", "Latest pass rate of a downstream eval set",
                  ["job_id", "eval_set"])
SET_PARAM = Gauge("scalerl_forecaster_eval_set_fit_param", "Fitted sigmoid parameter of a downstream eval set's curve",
                  ["job_id", "eval_set", "param"])
CURVE_COMPUTE = Gauge("scalerl_forecaster_curve_compute_device_hours", "Compute of each sampled curve point",
                      ["job_id", "point"])
POINT_VALUE = Gauge("scalerl_forecaster_point_pass_rate",
                    f"Measured validation pass rate, by index (at most {POINTS_SHOWN} points, evenly spread)",
                    ["job_id", "point"])
POINT_COMPUTE = Gauge("scalerl_forecaster_point_compute_device_hours",
                      f"Compute of each exported validation point, by index (at most {POINTS_SHOWN}; the live-fit "
                      "panel's x-axis)", ["job_id", "point"])


def export(curve: JobCurve) -> None:
    """Set every gauge of the curve's job from its points and latest fit."""
    job, fitted = curve.job_id, curve.fitted
    points = curve.sorted_points()
    POINTS.labels(job).set(len(points))
    if points:
        LAST_VALUE.labels(job).set(points[-1].value)
        LAST_COMPUTE.labels(job).set(points[-1].compute)
    for i, point in enumerate(shown(points)):  # indexed like the curve: the panel does not depend on the time range
        POINT_VALUE.labels(job, str(i)).set(point.value)
        POINT_COMPUTE.labels(job, str(i)).set(point.compute)
    if curve.recipe is not None and curve.recipe.budget.target_pass_rate is not None:
        TARGET.labels(job).set(curve.recipe.budget.target_pass_rate)
    if fitted is None or not fitted.forecast.model:
        IDENTIFIABLE.labels(job).set(0)
        return
    f = fitted.forecast
    for name, value in (("A", f.a), ("B", f.b), ("C_mid", f.c_mid), ("R0", f.r0)):
        PARAM.labels(job, name).set(value)
        if name in f.intervals:
            PARAM_LO.labels(job, name).set(f.intervals[name].lo)
            PARAM_HI.labels(job, name).set(f.intervals[name].hi)
    IDENTIFIABLE.labels(job).set(1 if f.identifiable else 0)
    if f.predictions:
        PREDICTED.labels(job).set(f.predictions[-1].value)
    TO_TARGET.labels(job).set(f.compute_to_target)
    if f.HasField("decision"):
        d = f.decision
        for rec in RECOMMENDATIONS:
            RECOMMENDATION.labels(job, rec).set(1 if d.recommendation == rec else 0)
        for pred in d.predictions:
            factor = f"{pred.compute / d.spent:g}x"
            ADVICE_VALUE.labels(job, factor, "fit").set(pred.value)
            ADVICE_VALUE.labels(job, factor, "lower").set(pred.interval.lo)
            ADVICE_VALUE.labels(job, factor, "upper").set(pred.interval.hi)
        TO_IDENTIFY.labels(job).set(d.compute_to_identify)
    if fitted.fit is not None:
        grid = np.linspace(0.0, fitted.budget, CURVE_POINTS)
        fit_values = fitted.fit.predict(grid)
        lower, upper = fitted.fit.predict_interval(grid)
        for i, c in enumerate(grid):
            CURVE_COMPUTE.labels(job, str(i)).set(float(c))
            CURVE_VALUE.labels(job, str(i), "fit").set(float(fit_values[i]))
            CURVE_VALUE.labels(job, str(i), "lower").set(float(lower[i]))
            CURVE_VALUE.labels(job, str(i), "upper").set(float(upper[i]))


def shown(points: list) -> list:
    """The points the gauges export: all of them up to POINTS_SHOWN, else POINTS_SHOWN evenly spread by index
    (the first and the last among them)."""
    if len(points) <= POINTS_SHOWN:
        return points
    return [points[i] for i in np.linspace(0, len(points) - 1, POINTS_SHOWN).round().astype(int)]


def export_set(curve: JobCurve) -> None:
    """The gauges of a downstream eval set's curve: its latest point and fitted parameters."""
    points = curve.sorted_points()
    if points:
        SET_VALUE.labels(curve.job_id, curve.eval_set).set(points[-1].value)
    f = curve.fitted.forecast if curve.fitted is not None else None
    if f is not None and f.model:
        for name, value in (("A", f.a), ("B", f.b), ("C_mid", f.c_mid), ("R0", f.r0)):
            SET_PARAM.labels(curve.job_id, curve.eval_set, name).set(value)


JOB_METRICS = (POINTS, PARAM, PARAM_LO, PARAM_HI, PREDICTED, TO_TARGET, TARGET, IDENTIFIABLE, LAST_VALUE, LAST_COMPUTE,
               CURVE_VALUE, CURVE_COMPUTE, POINT_VALUE, POINT_COMPUTE, RECOMMENDATION, ADVICE_VALUE, TO_IDENTIFY,
               SET_VALUE, SET_PARAM)


def forget_job(job_id: str) -> None:
    """Remove the job's series (it is no longer the active job), so the forecast alerts resolve."""
    remove_job_series(JOB_METRICS, job_id)
