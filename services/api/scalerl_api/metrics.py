"""Prometheus metrics of the api."""

from __future__ import annotations

from prometheus_client import Gauge

JOBS = Gauge("scalerl_api_jobs", "Jobs in the store by state", ["state"])
JOB_COMPUTE = Gauge("scalerl_api_job_compute_device_hours",
                    "A job's compute on the forecast's x-axis: learner + rollout generators (evaluator apart)",
                    ["job_id"])
JOB_EVALUATOR_COMPUTE = Gauge("scalerl_api_job_evaluator_device_hours",
                              "A job's evaluator compute (not in scalerl_api_job_compute_device_hours)", ["job_id"])


def forget_job(job_id: str) -> None:
    for gauge in (JOB_COMPUTE, JOB_EVALUATOR_COMPUTE):
        try:
            gauge.remove(job_id)
        except KeyError:
            pass
