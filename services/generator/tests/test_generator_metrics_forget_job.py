"""An ended job's series are removed (its alerts resolve); other jobs' series stay."""

from __future__ import annotations

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scalerl_generator import metrics


def jobs_exported() -> set[str]:
    return {s.labels["job_id"] for fam in text_string_to_metric_families(generate_latest(REGISTRY).decode())
            for s in fam.samples if fam.name.startswith("scalerl_generator_") and "job_id" in s.labels}


def test_forget_job_removes_only_that_jobs_series():
    for job in ("forget-a", "forget-b"):
        metrics.TOKENS.labels(job, "g-0").inc(10)
        metrics.IN_FLIGHT.labels(job, "g-1").set(2)
        metrics.PAUSE.labels(job).observe(0.1)
        metrics.COMPLETIONS.labels(job, "stop").inc()
        metrics.IDLE.labels(job, "g-0").inc(1)
    assert {"forget-a", "forget-b"} <= jobs_exported()
    metrics.forget_job("forget-a")
    assert "forget-a" not in jobs_exported() and "forget-b" in jobs_exported()
    metrics.forget_job("forget-b")
