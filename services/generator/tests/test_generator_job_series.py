"""A rollout replica exports its job's counters from the job's start (at 0), and forgets them at its end."""

from __future__ import annotations

from prometheus_client import REGISTRY

from scalerl_generator import metrics

COUNTERS = ("scalerl_generator_idle_seconds_total", "scalerl_generator_tokens_generated_total",
            "scalerl_generator_leases_lost_total")


def value(name: str, **labels) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_counters_exist_at_zero_from_the_start_and_go_with_the_job():
    job, gen = "series-job", "rollout-7"
    assert all(value(name, job_id=job, generator_id=gen) is None for name in COUNTERS)
    metrics.start_job(job, gen)
    assert [value(name, job_id=job, generator_id=gen) for name in COUNTERS] == [0.0, 0.0, 0.0]
    assert value("scalerl_generator_interruptions_total", job_id=job) == 0.0
    metrics.forget_job(job)
    assert all(value(name, job_id=job, generator_id=gen) is None for name in COUNTERS)
    assert value("scalerl_generator_interruptions_total", job_id=job) is None
