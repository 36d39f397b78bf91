"""Helpers for the services' Prometheus metrics (each service declares its own in its `metrics.py`)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics import MetricWrapperBase


def remove_job_series(metrics: Iterable[MetricWrapperBase], job_id: str) -> None:
    """Remove every series of `job_id` from labelled metrics whose first label is the job id."""
    for metric in metrics:
        for labels in [k for k in metric._metrics if k[0] == job_id]:  # prometheus_client keeps no public index
            metric.remove(*labels)


def job_ids(metrics: Iterable[MetricWrapperBase]) -> set[str]:
    """The job ids with a series in labelled metrics whose first label is the job id."""
    return {labels[0] for metric in metrics for labels in metric._metrics}
