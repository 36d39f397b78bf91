"""BufferStore against a real Redis-protocol server: leases, epochs, No-Positive-Resampling, drops by reason,
idempotency, redelivery, backpressure, clean-up and the accounting invariant."""

from __future__ import annotations

import random
import threading
import time
import uuid

import pytest

from buffer_testlib import CLAIM_IDLE_MS, assert_invariant, make_group
from scalerl.recipe import Recipe
from scalerl_replay_buffer.store import BufferStore, JobNotFound, RecipeConflict


def write_leased(store, job_id, lease, rewards=(1.0, 0.0), version=0, **kw):
    return store.write_groups([make_group(job_id, p, lease.lease_id, rewards, version, **kw) for p in lease.prompts])


# ------------------------------------------------------------------------------------------- jobs
def test_init_job_is_idempotent_and_rejects_a_different_recipe(store, new_job):
    job = new_job(num_prompts=10)
    recipe = Recipe(task={"num_train_prompts": 10}, pipeline={"max_staleness": 2, "prompts_per_batch": 4},
                    data={"lease_seconds": 30.0})
    assert store.init_job(job, recipe) == (10, False)
    with pytest.raises(RecipeConflict, match="recipe_json"):
        store.init_job(job, Recipe(task={"num_train_prompts": 11}))
    s = store.stats(job)
    assert (s.pool_size, s.epoch, s.groups_written) == (10, 0, 0)


def test_unknown_job_and_bad_job_id(store):
    with pytest.raises(JobNotFound):
        store.lease_prompts(f"nope-{uuid.uuid4().hex}", "g", 1)
    with pytest.raises(JobNotFound):
        store.read_batch(f"nope-{uuid.uuid4().hex}", "c", 1, 0)
    with pytest.raises(ValueError, match="job_id"):
        store.lease_prompts("bad:id", "g", 1)
    with pytest.raises(ValueError, match="max_prompts"):
        store.lease_prompts("x", "g", 0)


def test_store_needs_a_bytes_client(redis_url):
    import redis
    with pytest.raises(ValueError, match="decode_responses"):
        BufferStore(redis.Redis.from_url(redis_url, decode_responses=True))


# ------------------------------------------------------------------------------------------- leases
def test_two_generators_never_hold_the_same_prompt(store, new_job):
    job = new_job(num_prompts=40, max_staleness=100, prompts_per_batch=100)
    held: dict[str, str] = {}
    violations, lock = [], threading.Lock()

    def generator(name):
        for _ in range(15):
            lease = store.lease_prompts(job, name, 3)
            with lock:
                for p in lease.prompts:
                    if p.prompt_id in held:
                        violations.append((p.prompt_id, held[p.prompt_id], name))
                    held[p.prompt_id] = name
            time.sleep(random.random() * 0.003)
            with lock:
                for p in lease.prompts:
                    del held[p.prompt_id]
            write_leased(store, job, lease)  # releases the leases

    threads = [threading.Thread(target=generator, args=(f"gen-{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert violations == []
    s = assert_invariant(store, job)
    assert s.written == 6 * 15 * 3 and s.leased == 0 and s.epoch >= 6


def test_concurrent_leases_are_disjoint_while_held(store, new_job):
    job = new_job(num_prompts=30, max_staleness=100, prompts_per_batch=100)
    leases = [store.lease_prompts(job, f"g{i}", 4) for i in range(7)]  # 28 of 30
    ids = [p.prompt_id for lease in leases for p in lease.prompts]
    assert len(ids) == 28 and len(set(ids)) == 28
    last = store.lease_prompts(job, "g7", 4)  # 2 left in epoch 1; leased ones are deferred, not re-leased
    assert {p.prompt_id for p in last.prompts}.isdisjoint(ids)


def test_expired_lease_returns_the_prompt_to_the_pool(store, new_job):
    job = new_job(num_prompts=4, max_staleness=100, prompts_per_batch=100)
    crashed = store.lease_prompts(job, "crashed", 2, lease_seconds=0.2)
    other = store.lease_prompts(job, "other", 2)  # the rest of epoch 1
    time.sleep(0.3)
    again = store.lease_prompts(job, "other", 4)
    assert {p.prompt_id for p in again.prompts} == {p.prompt_id for p in crashed.prompts}
    assert all(p.epoch == 1 for p in again.prompts)  # back into epoch 1 (epoch 2's prompts are all held)
    assert {p.prompt_id for p in again.prompts}.isdisjoint(p.prompt_id for p in other.prompts)
    assert store.snapshot(job).leases_expired == 2
    # a late write from the crashed generator is refused and does not release the new holder's lease
    store.write_groups([make_group(job, p, crashed.lease_id) for p in crashed.prompts])
    assert store.snapshot(job).leased == 4


def test_epochs_cover_the_pool_then_reshuffle(store, new_job):
    job = new_job(num_prompts=8, max_staleness=100, prompts_per_batch=100)
    seen_by_epoch: dict[int, list[str]] = {}
    for _ in range(6):
        lease = store.lease_prompts(job, "g", 4)
        for p in lease.prompts:
            seen_by_epoch.setdefault(p.epoch, []).append(p.prompt_id)
        write_leased(store, job, lease)
    assert sorted(seen_by_epoch) == [1, 2, 3]
    for ids in seen_by_epoch.values():
        assert len(ids) == 8 and len(set(ids)) == 8
    assert seen_by_epoch[1] != seen_by_epoch[2]  # shuffled per epoch
    assert store.stats(job).epoch == 3


# ------------------------------------------------------------------------------------------- No-Positive-Resampling
def test_prompt_at_pass_rate_090_is_never_leased_again(store, new_job):
    job = new_job(num_prompts=5, max_staleness=100, prompts_per_batch=100, threshold=0.9)
    lease = store.lease_prompts(job, "g", 5)
    easy, hard = lease.prompts[0], lease.prompts[1:]
    store.write_groups([make_group(job, easy, lease.lease_id, rewards=[1.0] * 9 + [0.0])])  # 9/10 = 0.9
    write_leased(store, job, type(lease)(hard, lease.lease_id, False, 0, False), rewards=(1.0, 0.0))
    assert store.pass_rate(job, easy.prompt_id) == (9, 10)
    for _ in range(8):
        again = store.lease_prompts(job, "g", 5)
        assert easy.prompt_id not in {p.prompt_id for p in again.prompts}
        assert len(again.prompts) == 4
        write_leased(store, job, again, rewards=(1.0, 0.0))
    s = store.stats(job)
    assert s.retired_prompts == 1 and s.pool_size == 4 and s.epoch == 9


def test_pass_rate_history_accumulates_and_failed_completions_do_not_count(store, new_job):
    job = new_job(num_prompts=2, max_staleness=100, prompts_per_batch=100, threshold=0.9)
    lease = store.lease_prompts(job, "g", 1)
    p = lease.prompts[0]
    # 3 graded successes + 1 failed-to-grade: the group is dropped but the graded rewards update the history
    store.write_groups([make_group(job, p, lease.lease_id, rewards=[1.0, 1.0, 1.0, 0.0], failed=(3,))])
    assert store.pass_rate(job, p.prompt_id) == (3, 3)  # retired: 3/3 >= 0.9
    assert store.stats(job).retired_prompts == 1


def test_exhausted_when_every_prompt_is_retired(store, new_job):
    job = new_job(num_prompts=3, max_staleness=100, prompts_per_batch=100, threshold=0.5)
    lease = store.lease_prompts(job, "g", 3)
    write_leased(store, job, lease, rewards=(1.0, 0.0))  # 0.5 >= 0.5
    res = store.lease_prompts(job, "g", 3)
    assert res.exhausted and res.prompts == [] and store.stats(job).pool_size == 0


# ------------------------------------------------------------------------------------------- drops
def test_drops_are_counted_by_reason(store, new_job):
    job = new_job(num_prompts=8, max_staleness=2, prompts_per_batch=100)
    lease = store.lease_prompts(job, "g", 6)
    p = lease.prompts
    res = store.write_groups([
        make_group(job, p[0], lease.lease_id, rewards=(1.0, 0.0), failed=(1,)),  # failed_to_grade
        make_group(job, p[1], lease.lease_id, rewards=(0.0, 0.0, 0.0)),  # zero_variance
        make_group(job, p[2], lease.lease_id, rewards=(1.0, 1.0)),  # zero_variance
        make_group(job, p[3], lease.lease_id, rewards=(1.0, 0.0), version=0),  # stale at learner v3 (k=2)
        make_group(job, p[4], lease.lease_id, rewards=(1.0, 0.0), version=1),  # 2 behind: kept
        make_group(job, p[5], lease.lease_id, rewards=(1.0, -1.0), version=3),
    ])
    assert (res.written, res.dropped_zero_variance, res.dropped_failed_to_grade) == (3, 2, 1)
    batch = store.read_batch(job, "learner-0", 10, learner_version=3)
    assert batch.dropped_stale == 1
    assert sorted(min(s.version for c in b.group.completions for s in c.completion.versions)
                  for b in batch.groups) == [1, 3]
    s = assert_invariant(store, job)
    assert (s.written, s.dropped_failed_to_grade, s.dropped_zero_variance, s.dropped_stale, s.pending) == (6, 1, 2, 1, 2)
    assert s.generated_tokens == 4 * 13 and s.generator_device_seconds == pytest.approx(3.0)


def test_oldest_token_version_decides_staleness(store, new_job):
    from scalerl.v1 import common_pb2
    job = new_job(max_staleness=1, prompts_per_batch=100)
    g = make_group(job, "train-0", rewards=(1.0, 0.0), version=5)
    g.completions[1].completion.versions.insert(0, common_pb2.VersionSpan(version=2, start=0, end=1))
    store.write_groups([g])
    assert store.snapshot(job).oldest_pending_version == 2
    batch = store.read_batch(job, "c", 5, learner_version=4)  # 4 - 2 > 1 although most tokens are v5
    assert batch.groups == [] and batch.dropped_stale == 1


def test_zero_variance_filter_off_keeps_the_group(store, new_job):
    job = new_job(zero_variance_filter=False)
    res = store.write_groups([make_group(job, "train-0", rewards=(1.0, 1.0))])
    assert res.written == 1 and res.dropped_zero_variance == 0


def test_invalid_groups_name_the_field(store, new_job):
    job = new_job()
    g = make_group(job, "train-0")
    del g.completions[0].completion.versions[:]
    with pytest.raises(ValueError, match=r"groups\[1\]\.completions\[0\]\.completion\.versions"):
        store.write_groups([make_group(job, "train-1"), g])
    no_id = make_group(job, "train-1")
    no_id.group_id = ""
    with pytest.raises(ValueError, match=r"groups\[0\]\.group_id"):
        store.write_groups([no_id])
    assert store.snapshot(job).written == 0  # validation happens before anything is written


# ------------------------------------------------------------------------------------------- idempotency
def test_write_is_idempotent_on_group_id(store, new_job):
    job = new_job()
    g = make_group(job, "train-0", version=0)
    assert store.write_groups([g]).written == 1
    again = store.write_groups([g, g])
    assert again.written == 0 and again.duplicates == 2
    s = assert_invariant(store, job)
    assert s.written == 1 and s.pending == 1 and s.duplicates == 2 and s.generated_tokens == 8


def test_consumption_is_idempotent(store, new_job, r):
    job = new_job()
    store.write_groups([make_group(job, f"train-{i}") for i in range(3)])
    batch = store.read_batch(job, "c", 10, 0)
    ids = [b.entry_id for b in batch.groups]
    assert store.ack(job, ids) == 3
    assert store.ack(job, ids) == 0  # a retried ack counts nothing
    s = assert_invariant(store, job)
    assert s.trained == 3 and s.pending == 0
    # a second stream entry of a group already trained on (at-least-once somewhere upstream) is skipped
    trained_gid = batch.groups[0].group.group_id
    p = store.prefix(job)
    eid = r.xadd(p + "stream", {"gid": trained_gid, "v": 0, "g": batch.groups[0].group.SerializeToString()})
    r.zadd(p + "pending", {eid: 0})
    again = store.read_batch(job, "c", 10, 0)
    assert again.groups == []
    s = assert_invariant(store, job)
    assert s.trained == 3 and s.pending == 0


def test_consumer_killed_before_ack_its_groups_go_to_another(store, new_job):
    job = new_job()
    store.write_groups([make_group(job, f"train-{i}", version=1) for i in range(4)])
    a = store.read_batch(job, "learner-a", 10, 1)
    assert len(a.groups) == 4 and not any(b.redelivered for b in a.groups)
    # learner-a dies here without acking
    assert store.read_batch(job, "learner-b", 10, 1).groups == []  # not idle long enough yet
    assert store.snapshot(job).pending == 4
    time.sleep(CLAIM_IDLE_MS / 1000 + 0.1)
    b = store.read_batch(job, "learner-b", 10, 1)
    assert {x.entry_id for x in b.groups} == {x.entry_id for x in a.groups}
    assert all(x.redelivered for x in b.groups)
    assert [x.group for x in b.groups] == [x.group for x in a.groups]
    assert store.ack(job, [x.entry_id for x in b.groups]) == 4
    assert store.ack(job, [x.entry_id for x in a.groups]) == 0  # the zombie's late ack counts nothing
    s = assert_invariant(store, job)
    assert s.trained == 4 and s.pending == 0


def test_redelivered_groups_that_went_stale_are_dropped(store, new_job):
    job = new_job(max_staleness=1)
    store.write_groups([make_group(job, "train-0", version=0)])
    assert len(store.read_batch(job, "a", 10, 0).groups) == 1
    time.sleep(CLAIM_IDLE_MS / 1000 + 0.1)
    b = store.read_batch(job, "b", 10, learner_version=5)
    assert b.groups == [] and b.dropped_stale == 1
    assert assert_invariant(store, job).pending == 0


def test_ack_untrained_counts_as_learner_side_stale_drop(store, new_job):
    job = new_job()
    store.write_groups([make_group(job, "train-0")])
    batch = store.read_batch(job, "c", 1, 0)
    assert store.ack(job, [batch.groups[0].entry_id], trained=False) == 1
    s = assert_invariant(store, job)
    assert s.dropped_stale == 1 and s.trained == 0
    with pytest.raises(ValueError, match=r"entry_ids\[0\]"):
        store.ack(job, ["not-an-id"])


def test_read_blocks_until_a_group_arrives(store, new_job):
    job = new_job()
    threading.Timer(0.2, lambda: store.write_groups([make_group(job, "train-0")])).start()
    t0 = time.monotonic()
    batch = store.read_batch(job, "c", 4, 0, block_ms=3000)
    assert len(batch.groups) == 1 and 0.1 < time.monotonic() - t0 < 2.5


# ------------------------------------------------------------------------------------------- backpressure
def test_backpressure_bounds_the_backlog(store, new_job):
    job = new_job(num_prompts=50, max_staleness=1, prompts_per_batch=3)  # bound (k+1)*ppb = 6
    first = store.lease_prompts(job, "g", 4)
    assert len(first.prompts) == 4 and not first.slow_down
    second = store.lease_prompts(job, "g", 4)
    assert len(second.prompts) == 2 and second.slow_down and second.retry_after_s > 0
    third = store.lease_prompts(job, "g", 1)
    assert third.prompts == [] and third.slow_down and third.retry_after_s > 0
    # written but unread groups still count
    write_leased(store, job, first)
    write_leased(store, job, second)
    assert store.snapshot(job).backlog == 6
    assert store.lease_prompts(job, "g", 1).slow_down
    # the learner takes a batch: room for that many again
    batch = store.read_batch(job, "learner", 3, 0)
    assert store.snapshot(job).backlog == 3
    resumed = store.lease_prompts(job, "g", 10)
    assert len(resumed.prompts) == 3 and resumed.slow_down
    store.ack(job, [b.entry_id for b in batch.groups])
    assert_invariant(store, job)


# ------------------------------------------------------------------------------------------- clean-up
def test_cleanup_deletes_every_key_of_the_job_and_nothing_else(store, new_job, r):
    a = new_job(job_id=f"c{uuid.uuid4().hex[:8]}")
    b = new_job(job_id=a + ".x")  # a's prefix plus more: must survive a's clean-up
    for job in (a, b):
        lease = store.lease_prompts(job, "g", 3)
        write_leased(store, job, lease, rewards=(1.0, 0.0))
        write_leased(store, job, store.lease_prompts(job, "g", 1), rewards=(0.0, 0.0))
        batch = store.read_batch(job, "c", 1, 0)
        store.ack(job, [x.entry_id for x in batch.groups])
    keys_of = lambda job: sorted(r.scan_iter(match=f"scalerl:{job}:*"))  # noqa: E731
    before_b = keys_of(b)
    assert len(keys_of(a)) >= 10
    assert store.cleanup_job(a) == len(before_b)
    assert keys_of(a) == [] and not store.job_exists(a)
    assert keys_of(b) == before_b
    assert store.cleanup_job(a) == 0


# ------------------------------------------------------------------------------------------- invariant
def test_accounting_invariant_under_a_random_mix(store, new_job):
    rng = random.Random(1234)
    job = new_job(num_prompts=30, max_staleness=2, prompts_per_batch=4, threshold=1.0)
    leases, written, held = [], [], {"a": [], "b": []}
    version = 0
    for step in range(250):
        op = rng.random()
        if op < 0.3:
            lease = store.lease_prompts(job, "g", rng.randint(1, 4), lease_seconds=rng.choice([0.05, 30]))
            leases.extend((lease.lease_id, p) for p in lease.prompts)
        elif op < 0.55 and leases:
            lid, p = leases.pop(rng.randrange(len(leases)))
            kind = rng.random()
            rewards = (1.0, 1.0) if kind < 0.2 else (0.0, 1.0, 0.0)
            failed = (0,) if 0.2 <= kind < 0.35 else ()
            g = make_group(job, p, lid, rewards, version=max(0, version - rng.randint(0, 4)), failed=failed)
            if store.write_groups([g]).lost_lease == 0:  # refused when its lease expired and went elsewhere
                written.append(g)
        elif op < 0.6 and written:
            store.write_groups([rng.choice(written)])  # retry
        elif op < 0.8:
            consumer = rng.choice("ab")
            batch = store.read_batch(job, consumer, rng.randint(1, 5), version)
            held[consumer].extend(x.entry_id for x in batch.groups)
        elif op < 0.95:
            consumer = rng.choice("ab")
            if held[consumer]:
                n = rng.randint(1, len(held[consumer]))
                ids, held[consumer] = held[consumer][:n], held[consumer][n:]
                store.ack(job, ids, trained=rng.random() < 0.85)
        else:
            version += 1
        if rng.random() < 0.05:
            time.sleep(CLAIM_IDLE_MS / 1000)  # let leases expire and deliveries go idle (redelivery)
            held[rng.choice("ab")].clear()  # that consumer "crashes"
        assert_invariant(store, job)
    s = store.snapshot(job)
    assert s.written == len({g.group_id for g in written})
    assert s.trained > 0 and s.dropped_stale > 0 and s.dropped_zero_variance > 0 and s.dropped_failed_to_grade > 0
