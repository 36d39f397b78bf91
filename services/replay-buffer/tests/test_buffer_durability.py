"""Valkey killed (SIGKILL) and restarted with AOF, appendfsync always: nothing acknowledged is lost.

Always its own embedded Valkey (a shared server cannot be killed), even when SCALERL_TEST_REDIS_URL is set."""

from __future__ import annotations

import time

import redis

from buffer_testlib import assert_invariant, make_group
from scalerl.recipe import Recipe
from scalerl_replay_buffer.embedded import EmbeddedValkey
from scalerl_replay_buffer.store import BufferStore


def test_kill_and_restart_with_aof_loses_nothing_acknowledged(tmp_path):
    with EmbeddedValkey(tmp_path / "valkey", appendonly=True) as server:
        client = redis.Redis.from_url(server.url, retry_on_timeout=True)
        store = BufferStore(client, claim_idle_ms=100)
        job = "durable"
        store.init_job(job, Recipe(task={"num_train_prompts": 64}, pipeline={"prompts_per_batch": 8}))
        lease = store.lease_prompts(job, "g", 40)
        groups = [make_group(job, p, lease.lease_id, rewards=(1.0, 0.0), version=3) for p in lease.prompts]
        written = [g.group_id for g in groups if store.write_groups([g]).written == 1]  # each write acknowledged
        assert len(written) == 40
        first = store.read_batch(job, "learner", 10, 3)
        assert store.ack(job, [b.entry_id for b in first.groups]) == 10
        unacked = store.read_batch(job, "learner", 5, 3)  # delivered, not acknowledged
        before = store.snapshot(job)
        port = server.port

        server.restart(kill=True)  # crash: no shutdown save, only the fsync'ed AOF
        assert server.port == port
        client.connection_pool.disconnect()

        after = store.snapshot(job)
        assert after == before
        assert store.pass_rate(job, lease.prompts[0].prompt_id) == (1, 2)
        # the 30 unacknowledged groups are all still there: 25 undelivered + 5 redelivered after the claim timeout
        time.sleep(0.15)
        rest = store.read_batch(job, "learner-2", 100, 3)
        got = {b.group.group_id for b in rest.groups}
        assert len(got) == 30 and {b.entry_id for b in unacked.groups} <= {b.entry_id for b in rest.groups}
        assert got | {b.group.group_id for b in first.groups} == set(written)
        assert store.ack(job, [b.entry_id for b in rest.groups]) == 30
        assert store.ack(job, [b.entry_id for b in first.groups]) == 0  # trained before the crash stays trained
        s = assert_invariant(store, job)
        assert s.trained == 40 and s.pending == 0
        # the lease state survived too: the other 24 prompts of the epoch
        rest_of_epoch = [p for p in store.lease_prompts(job, "g", 64).prompts if p.epoch == 1]
        assert len(rest_of_epoch) == 24
        assert {p.prompt_id for p in rest_of_epoch}.isdisjoint(p.prompt_id for p in lease.prompts)
        client.close()
