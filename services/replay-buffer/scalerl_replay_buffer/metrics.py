"""Prometheus metrics of the replay buffer, read from Redis at scrape time.

The service is stateless and its replicas share Redis, so per-process counters would split (and restart at
zero) across replicas; instead a Collector reads every job's counters from Redis on each scrape. All replicas
then export the same values: aggregate with max() (or scrape one replica), never sum().
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry

from scalerl import errors
from scalerl.logs import job_logger

from .store import BufferStore

log = logging.getLogger(__name__)


class BufferCollector(Collector):
    """Exports, per job_id:
    scalerl_buffer_backlog_groups                 undelivered groups + leased prompts (the backpressure quantity)
    scalerl_buffer_groups_written_total
    scalerl_buffer_groups_trained_total
    scalerl_buffer_groups_dropped_total{reason}   stale | zero_variance | failed_to_grade
    scalerl_buffer_oldest_pending_version_lag     latest learner version - oldest pending group's oldest token
    scalerl_buffer_pool_prompts                   prompts that can still be leased
    scalerl_buffer_retired_prompts                prompts retired by No-Positive-Resampling
    `jobs`: the job ids to export (default: every job with state in Redis, found by SCAN).
    """

    def __init__(self, store: BufferStore, jobs: Callable[[], Iterable[str]] | None = None):
        self.store = store
        self.jobs = jobs or store.list_jobs

    def describe(self):
        return []  # collected dynamically (no Redis access at registration)

    def collect(self):
        backlog = GaugeMetricFamily("scalerl_buffer_backlog_groups",
                                    "Groups written and not yet delivered to a learner plus prompts under lease",
                                    labels=["job_id"])
        written = CounterMetricFamily("scalerl_buffer_groups_written_total",
                                      "Distinct scored groups received from generators", labels=["job_id"])
        trained = CounterMetricFamily("scalerl_buffer_groups_trained_total",
                                      "Groups acknowledged as trained by the learner", labels=["job_id"])
        dropped = CounterMetricFamily("scalerl_buffer_groups_dropped_total", "Groups dropped, by reason",
                                      labels=["job_id", "reason"])
        lag = GaugeMetricFamily("scalerl_buffer_oldest_pending_version_lag",
                                "Learner version minus the oldest token version of the oldest pending group",
                                labels=["job_id"])
        pool = GaugeMetricFamily("scalerl_buffer_pool_prompts", "Prompts that can still be leased (not retired)",
                                 labels=["job_id"])
        retired = GaugeMetricFamily("scalerl_buffer_retired_prompts",
                                    "Prompts retired by No-Positive-Resampling", labels=["job_id"])
        try:
            jobs = list(self.jobs())
        except errors.Unavailable as err:
            log.warning("metrics: cannot list jobs: %s", err)
            jobs = []
        for job_id in jobs:
            try:
                s = self.store.snapshot(job_id)
            except (errors.NotFound, errors.InvalidArgument):  # cleaned up since the listing
                continue
            except errors.Unavailable as err:
                job_logger(log, job_id).warning("metrics: %s", err)
                continue
            backlog.add_metric([job_id], s.backlog)
            written.add_metric([job_id], s.written)
            trained.add_metric([job_id], s.trained)
            dropped.add_metric([job_id, "stale"], s.dropped_stale)
            dropped.add_metric([job_id, "zero_variance"], s.dropped_zero_variance)
            dropped.add_metric([job_id, "failed_to_grade"], s.dropped_failed_to_grade)
            lag.add_metric([job_id], s.oldest_pending_version_lag)
            pool.add_metric([job_id], s.pool_size)
            retired.add_metric([job_id], s.retired_prompts)
        yield from (backlog, written, trained, dropped, lag, pool, retired)


def register_metrics(store: BufferStore, registry: CollectorRegistry = REGISTRY,
                     jobs: Callable[[], Iterable[str]] | None = None) -> BufferCollector:
    collector = BufferCollector(store, jobs)
    registry.register(collector)
    return collector
