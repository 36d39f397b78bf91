"""Every Prometheus object of the weight-broadcast service."""

from prometheus_client import Counter, Gauge

VERSION = Gauge("scalerl_weights_version", "Latest published policy version", ["job_id"])
PUBLISHED_BYTES = Counter("scalerl_weights_published_bytes_total", "Bytes published by the learner", ["job_id"])
SENT_BYTES = Counter("scalerl_weights_sent_bytes_total", "Bytes streamed to subscribers", ["job_id"])
SUBSCRIBERS = Gauge("scalerl_weights_subscribers", "Open subscriptions", ["job_id"])
