"""Prometheus metrics of the reward-grader."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

GRADED = Counter("scalerl_grader_items_total", "Graded items by outcome", ["job_id", "task", "status"])
LATENCY = Histogram("scalerl_grader_request_duration_seconds", "Grade request latency", ["job_id"])
WORKER_RESTARTS = Counter("scalerl_grader_verifier_restarts_total",
                          "Verifier processes killed (timed out or died) and replaced")
