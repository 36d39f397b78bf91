"""An ended job's series are removed (its alerts resolve); other jobs' series stay."""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scalerl_forecaster import metrics


def jobs_exported() -> set[str]:
    return {s.labels["job_id"] for fam in text_string_to_metric_families(generate_latest(REGISTRY).decode())
            for s in fam.samples if fam.name.startswith("scalerl_forecaster_") and "job_id" in s.labels}


def test_forget_job_removes_only_that_jobs_series():
    for job in ("forget-a", "forget-b"):
        metrics.POINTS.labels(job).set(3)
        metrics.PARAM_HI.labels(job, "A").set(0.5)
        metrics.CURVE_VALUE.labels(job, "0", "fit").set(0.1)
        metrics.IDENTIFIABLE.labels(job).set(1)
    assert {"forget-a", "forget-b"} <= jobs_exported()
    metrics.forget_job("forget-a")
    assert "forget-a" not in jobs_exported() and "forget-b" in jobs_exported()
    metrics.forget_job("forget-b")


def test_only_the_active_jobs_forecast_is_exported(tmp_path):
    from scalerl.v1 import common_pb2
    from scalerl_forecaster.jobs import Forecasts

    forecasts = Forecasts(state_dir=tmp_path)
    for job in ("ended-job", "active-job"):
        forecasts.add_point(common_pb2.ValidationPoint(job_id=job, policy_version=0, compute=0.1, value=0.2))
    forecasts.export_only("active-job")
    assert "ended-job" not in jobs_exported() and "active-job" in jobs_exported()
    # A restart replays both jobs' points from the volume; the watcher's first poll drops the ended one again.
    restarted = Forecasts(state_dir=tmp_path)
    assert {"ended-job", "active-job"} <= jobs_exported()
    restarted.export_only("active-job")
    assert "ended-job" not in jobs_exported() and "active-job" in jobs_exported()
    assert [p.policy_version for p in restarted.points("ended-job")] == [0]  # the points themselves are kept
    restarted.export_only(None)
    assert "active-job" not in jobs_exported()


def test_every_measured_point_is_an_indexed_gauge(tmp_path):
    """The live-fit panel reads the measured points as instant gauges indexed by `point`, in compute order."""
    from scalerl.v1 import common_pb2
    from scalerl_forecaster.jobs import Forecasts

    forecasts = Forecasts(state_dir=tmp_path)
    for version, compute, value in ((2, 0.2, 0.4), (0, 0.0, 0.1), (1, 0.1, 0.3)):
        forecasts.add_point(common_pb2.ValidationPoint(job_id="points-job", policy_version=version, compute=compute,
                                                       value=value))
    get = REGISTRY.get_sample_value
    assert [get("scalerl_forecaster_point_compute_device_hours", {"job_id": "points-job", "point": str(i)})
            for i in range(3)] == [0.0, 0.1, 0.2]
    assert [get("scalerl_forecaster_point_pass_rate", {"job_id": "points-job", "point": str(i)})
            for i in range(3)] == [0.1, 0.3, 0.4]
    metrics.forget_job("points-job")
    assert get("scalerl_forecaster_point_pass_rate", {"job_id": "points-job", "point": "0"}) is None
