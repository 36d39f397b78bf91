"""Prometheus metrics of the replay buffer, read from Redis at scrape time.

The service is stateless and its replicas share Redis, so per-process counters would split (and restart at
zero) across replicas; instead a Collector reads every job's counters from Redis on each scrape. So that the
values are not exported once per replica (sum() would multiply them), only the replica holding a Redis lease
(EXPORTER_KEY, renewed on each of its scrapes) exports them; the others export the families without samples.
When the holder stops being scraped its lease lapses and the next replica scraped takes over: sum() and max()
both give the truth read from Redis.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable

import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry

from scalerl import errors
from scalerl.logs import job_logger

from .store import BufferStore

log = logging.getLogger(__name__)

EXPORTER_KEY = "scalerl:metrics-exporter"
"""Redis key naming the one replica that exports the Redis-derived metrics (outside every job's key prefix)."""

# KEYS: exporter key; ARGV: this replica's id, lease ms -> 1 if this replica holds the lease (taken or renewed)
_HOLD = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""


class BufferCollector(Collector):
    """Exports, per job_id:
    scalerl_buffer_backlog_groups                 undelivered groups + leased prompts (the backpressure quantity)
    scalerl_buffer_groups_written_total
    scalerl_buffer_groups_trained_total
    scalerl_buffer_groups_dropped_total{reason}   stale | zero_variance | failed_to_grade
    scalerl_buffer_oldest_pending_version_lag     latest learner version - oldest pending group's oldest token
    scalerl_buffer_pool_prompts                   prompts that can still be leased
    scalerl_buffer_retired_prompts                prompts retired by No-Positive-Resampling
    scalerl_buffer_prompt_epoch                   pass over the prompt pool now being leased (1 = the first)
    scalerl_buffer_prompts_unretired_total        retired prompts back in the pool (mostly failed rechecks)
    `jobs`: the job ids to export (default: every job with state in Redis, found by SCAN).
    `replica_id`: this replica's name in the exporter lease; `lease_s`: how long a lease outlives its last scrape
    (longer than the scrape interval, or the lease changes hands between scrapes).
    """

    def __init__(self, store: BufferStore, jobs: Callable[[], Iterable[str]] | None = None, *,
                 replica_id: str | None = None, lease_s: float = 60.0, exporter_key: str = EXPORTER_KEY):
        self.store = store
        self.jobs = jobs or store.list_jobs
        self.replica_id = replica_id or f"{socket.gethostname()}:{os.getpid()}"
        self.lease_ms = int(lease_s * 1000)
        self.exporter_key = exporter_key
        self._hold = store.r.register_script(_HOLD)

    def is_exporter(self) -> bool:
        """Take or renew the exporter lease -> whether this replica exports the Redis-derived values."""
        try:
            return bool(self._hold(keys=[self.exporter_key], args=[self.replica_id, self.lease_ms]))
        except redis.RedisError as err:
            log.warning("metrics: cannot take the exporter lease: %s", err)
            return False

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
        epoch = GaugeMetricFamily("scalerl_buffer_prompt_epoch",
                                  "Pass over the prompt pool now being leased (1 = the first; 0 before any lease); "
                                  "each pass holds only the prompts not retired by then", labels=["job_id"])
        unretired = CounterMetricFamily("scalerl_buffer_prompts_unretired_total",
                                        "Retired prompts returned to the pool because their latest epoch fell "
                                        "below the No-Positive-Resampling threshold (mostly rechecks: "
                                        "data.retired_recheck_fraction)", labels=["job_id"])
        refused = CounterMetricFamily("scalerl_buffer_writes_refused_total",
                                      "Group writes refused (not counted as written), by reason",
                                      labels=["job_id", "reason"])
        try:
            jobs = list(self.jobs()) if self.is_exporter() else []
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
            epoch.add_metric([job_id], s.epoch)
            unretired.add_metric([job_id], s.unretired)
            refused.add_metric([job_id, "lost_lease"], s.lost_lease)
        yield from (backlog, written, trained, dropped, lag, pool, retired, epoch, unretired, refused)


def register_metrics(store: BufferStore, registry: CollectorRegistry = REGISTRY,
                     jobs: Callable[[], Iterable[str]] | None = None, *, replica_id: str | None = None,
                     lease_s: float = 60.0, exporter_key: str = EXPORTER_KEY) -> BufferCollector:
    collector = BufferCollector(store, jobs, replica_id=replica_id, lease_s=lease_s, exporter_key=exporter_key)
    registry.register(collector)
    return collector
