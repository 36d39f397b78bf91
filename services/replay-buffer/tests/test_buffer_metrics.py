"""The Redis-derived buffer metrics are exported by one replica at a time, so sum() over replicas is the truth."""

from __future__ import annotations

import time
import uuid

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scalerl_replay_buffer.metrics import register_metrics


def written_samples(registry: CollectorRegistry, job_id: str) -> list[float]:
    return [s.value for fam in text_string_to_metric_families(generate_latest(registry).decode())
            for s in fam.samples if s.name == "scalerl_buffer_groups_written_total" and s.labels["job_id"] == job_id]


def test_two_replicas_export_each_value_once_and_hand_over(store, new_job, r):
    job_id = new_job()
    r.hset(store.prefix(job_id) + "counters", "written", 7)
    key = f"scalerl:test-exporter-{uuid.uuid4().hex[:8]}"
    replicas = [CollectorRegistry(), CollectorRegistry()]
    for name, registry in zip("ab", replicas):
        register_metrics(store, registry, jobs=lambda: [job_id], replica_id=name, lease_s=0.5, exporter_key=key)
    try:
        for _ in range(3):  # every scrape round: exactly one replica exports, so the sum is the Redis value
            exported = [written_samples(reg, job_id) for reg in replicas]
            assert sum(sum(v) for v in exported) == store.snapshot(job_id).written
            assert sorted(len(v) for v in exported) == [0, 1]
        assert written_samples(replicas[0], job_id) == [store.snapshot(job_id).written]  # a took the lease first
        time.sleep(0.7)  # a is no longer scraped: its lease lapses and b takes over
        assert written_samples(replicas[1], job_id) == [store.snapshot(job_id).written]
        assert written_samples(replicas[0], job_id) == []
    finally:
        r.delete(key)
