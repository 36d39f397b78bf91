"""Prometheus metrics of the api."""

from __future__ import annotations

from prometheus_client import Gauge

JOBS = Gauge("scalerl_api_jobs", "Jobs in the store by state", ["state"])
