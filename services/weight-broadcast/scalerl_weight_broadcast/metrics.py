"""Every Prometheus object of the weight-broadcast service."""

from prometheus_client import Counter, Gauge

from scalerl.metrics import job_ids, remove_job_series

VERSION = Gauge("scalerl_weights_version", "Latest published policy version", ["job_id"])
PUBLISHED_BYTES = Counter("scalerl_weights_published_bytes_total",
                          "Bytes the learner sent (a delta sends fewer than the version's size)", ["job_id"])
SENT_BYTES = Counter("scalerl_weights_sent_bytes_total", "Bytes the hub streamed to subscribers", ["job_id"])
SUBSCRIBERS = Gauge("scalerl_weights_subscribers", "Open subscriptions at the hub", ["job_id"])
RELAY_MEMBERS = Gauge("scalerl_weight_broadcast_relay_members", "Subscribers placed in the relay tree", ["job_id"])

JOB_METRICS = (VERSION, PUBLISHED_BYTES, SENT_BYTES, SUBSCRIBERS, RELAY_MEMBERS)


def forget_job(job_id: str) -> None:
    remove_job_series(JOB_METRICS, job_id)


def jobs() -> set[str]:
    return job_ids(JOB_METRICS)
