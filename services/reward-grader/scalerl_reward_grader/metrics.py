"""Prometheus metrics of the reward-grader."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from scalerl.metrics import job_ids, remove_job_series

GRADED = Counter("scalerl_grader_items_total", "Graded items by outcome", ["job_id", "task", "status"])
LATENCY = Histogram("scalerl_grader_request_duration_seconds", "Grade request latency", ["job_id"])
WORKER_RESTARTS = Counter("scalerl_grader_verifier_restarts_total",
                          "Verifier processes killed (timed out or died) and replaced")

JOB_METRICS = (GRADED, LATENCY)


def keep_only(job_id: str | None) -> None:
    """Remove the series of every job but the active one (an ended job's counters stop, so they go)."""
    for job in job_ids(JOB_METRICS) - {job_id}:
        remove_job_series(JOB_METRICS, job)
