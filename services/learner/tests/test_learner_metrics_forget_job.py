"""An ended job's series are removed (its alerts resolve); other jobs' series stay."""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scalerl_learner import metrics


def jobs_exported() -> set[str]:
    return {s.labels["job_id"] for fam in text_string_to_metric_families(generate_latest(REGISTRY).decode())
            for s in fam.samples if fam.name.startswith("scalerl_learner_") and "job_id" in s.labels}


def test_forget_job_removes_only_that_jobs_series():
    for job in ("forget-a", "forget-b"):
        metrics.STEP.labels(job).set(3)
        metrics.LAST_STEP.labels(job).set(1.0)
        metrics.STEP_SECONDS.labels(job).observe(0.2)
        metrics.STARVED.labels(job).inc(1)
        for role in ("learner", "generator", "evaluator"):
            metrics.COMPUTE.labels(job, role).set(0.5)
    assert {"forget-a", "forget-b"} <= jobs_exported()
    metrics.forget_job("forget-a")
    assert "forget-a" not in jobs_exported() and "forget-b" in jobs_exported()
    metrics.forget_job("forget-b")
