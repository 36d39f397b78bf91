"""The grader exports per-job series only for the active job: an ended job's counters go (issue 16)."""

from __future__ import annotations

from prometheus_client import REGISTRY

from scalerl_reward_grader import metrics


def items(job_id: str) -> float | None:
    return REGISTRY.get_sample_value("scalerl_grader_items_total",
                                     {"job_id": job_id, "task": "arithmetic", "status": "graded"})


def test_only_the_active_jobs_series_stay():
    for job in ("grader-ended", "grader-active"):
        metrics.GRADED.labels(job, "arithmetic", "graded").inc(3)
        metrics.LATENCY.labels(job).observe(0.1)
    metrics.keep_only("grader-active")
    assert items("grader-ended") is None and items("grader-active") == 3
    assert REGISTRY.get_sample_value("scalerl_grader_request_duration_seconds_count", {"job_id": "grader-ended"}) is None
    metrics.keep_only(None)
    assert items("grader-active") is None
