"""BufferStore against a real Redis-protocol server: the review fixes of issue 14 — a reader never re-claims its
own pending entries (c), leases are renewed and a write whose lease went to another generator is refused (h),
PPO-off-policy-k caps generation per frozen version (j), No-Positive-Resampling on the latest epoch (k), and
its off switch and rechecks of retired prompts (session 15)."""

from __future__ import annotations

import time
import uuid

from buffer_testlib import CLAIM_IDLE_MS, assert_invariant, make_group


# ------------------------------------------------------------------------------------------- c. no group twice
def test_a_slow_batch_fill_never_gets_its_own_pending_entries_again(store, new_job):
    job = new_job()
    store.write_groups([make_group(job, f"train-{i}", version=1) for i in range(2)])
    first = store.read_batch(job, "learner-a", 4, 1)
    assert len(first.groups) == 2
    time.sleep(CLAIM_IDLE_MS / 1000 + 0.1)  # the batch fill is slower than the claim timeout
    store.write_groups([make_group(job, f"train-{i}", version=1) for i in range(2, 4)])
    second = store.read_batch(job, "learner-a", 2, 1)
    batch = list(first.groups) + list(second.groups)
    assert len({b.entry_id for b in batch}) == len(batch) == 4
    assert len({b.group.group_id for b in batch}) == 4
    assert not any(b.redelivered for b in second.groups)
    # another consumer (the one that replaced a dead learner) still gets entries left idle
    time.sleep(CLAIM_IDLE_MS / 1000 + 0.1)
    other = store.read_batch(job, "learner-b", 10, 1)
    assert {b.entry_id for b in other.groups} == {b.entry_id for b in batch}
    assert store.ack(job, [b.entry_id for b in other.groups]) == 4
    assert assert_invariant(store, job).trained == 4


def test_two_entries_of_one_group_never_share_a_batch(store, new_job, r):
    job = new_job()
    g = make_group(job, "train-0", version=0)
    store.write_groups([g])
    p = store.prefix(job)  # a second stream entry of the same group (at-least-once upstream)
    eid = r.xadd(p + "stream", {"gid": g.group_id, "v": 0, "g": g.SerializeToString()})
    r.zadd(p + "pending", {eid: 0})
    batch = store.read_batch(job, "c", 10, 0)
    assert [b.group.group_id for b in batch.groups] == [g.group_id]
    store.ack(job, [b.entry_id for b in batch.groups])
    s = assert_invariant(store, job)
    assert s.trained == 1 and s.pending == 0


# ------------------------------------------------------------------------------------------- h. lease renewal
def test_renewed_lease_outlives_its_first_deadline(store, new_job):
    job = new_job(num_prompts=2, max_staleness=100, prompts_per_batch=100)
    lease = store.lease_prompts(job, "slow", 1, lease_seconds=0.3)
    pid = lease.prompts[0].prompt_id
    for _ in range(4):  # 0.6 s of generation, renewed every 0.15 s
        time.sleep(0.15)
        assert store.renew_leases(job, lease.lease_id, [pid], lease_seconds=0.3) == []
    other = store.lease_prompts(job, "other", 2)
    assert pid not in {p.prompt_id for p in other.prompts}
    assert store.snapshot(job).leases_expired == 0
    assert store.write_groups([make_group(job, lease.prompts[0], lease.lease_id)]).written == 1


def test_a_write_whose_lease_went_to_another_generator_is_refused(store, new_job):
    job = new_job(num_prompts=1, max_staleness=100, prompts_per_batch=100)
    stuck = store.lease_prompts(job, "stuck", 1, lease_seconds=0.2)
    p = stuck.prompts[0]
    time.sleep(0.3)
    taken = store.lease_prompts(job, "other", 1)
    assert [q.prompt_id for q in taken.prompts] == [p.prompt_id]
    assert store.renew_leases(job, stuck.lease_id, [p.prompt_id]) == [p.prompt_id]  # the stuck one learns it
    late = store.write_groups([make_group(job, p, stuck.lease_id)])
    assert (late.written, late.lost_lease) == (0, 1)
    assert store.snapshot(job).leased == 1  # the new holder keeps its lease
    assert store.write_groups([make_group(job, taken.prompts[0], taken.lease_id)]).written == 1
    s = assert_invariant(store, job)
    assert (s.written, s.lost_lease, s.pending, s.leased) == (1, 1, 1, 0)


# ------------------------------------------------------------------------------------------- j. PPO-off-policy-k
def test_ppo_off_policy_samples_k_batches_per_frozen_version(store, new_job):
    job = new_job(num_prompts=200, max_staleness=2, prompts_per_batch=3, mode="ppo_off_policy")  # quota 2 * 3
    store.read_batch(job, "learner", 1, 0)  # the learner is at version 0
    first = store.lease_prompts(job, "g", 10)
    assert len(first.prompts) == 6 and first.slow_down
    # zero-variance groups do not use the quota: their prompts are replaced (no deadlock when drops leave the
    # learner short of its k batches)
    store.write_groups([make_group(job, p, first.lease_id, rewards=(1.0, 1.0)) for p in first.prompts[:2]])
    store.write_groups([make_group(job, p, first.lease_id, rewards=(1.0, 0.0)) for p in first.prompts[2:]])
    refill = store.lease_prompts(job, "g", 10)
    assert len(refill.prompts) == 2
    store.write_groups([make_group(job, p, refill.lease_id, rewards=(1.0, 0.0)) for p in refill.prompts])
    assert store.lease_prompts(job, "g", 10).prompts == []  # k * prompts_per_batch accepted at version 0
    # the learner trains k batches on version 0; no more groups appear until it publishes
    for _ in range(2):
        batch = store.read_batch(job, "learner", 3, 0)
        assert len(batch.groups) == 3
        store.ack(job, [b.entry_id for b in batch.groups])
        assert store.lease_prompts(job, "g", 10).prompts == []
    assert store.snapshot(job).trained == 6
    # the learner published version 1: a new quota of k batches
    assert store.read_batch(job, "learner", 3, 1).groups == []
    after = store.lease_prompts(job, "g", 10)
    assert len(after.prompts) == 6
    assert_invariant(store, job)


def test_pipeline_rl_has_no_version_quota(store, new_job):
    job = new_job(num_prompts=200, max_staleness=2, prompts_per_batch=3)
    lease = store.lease_prompts(job, "g", 9)
    store.write_groups([make_group(job, p, lease.lease_id) for p in lease.prompts])
    batch = store.read_batch(job, "learner", 9, 0)
    store.ack(job, [b.entry_id for b in batch.groups])
    assert len(store.lease_prompts(job, "g", 9).prompts) == 9  # only backpressure: (k + 1) * 3


# ------------------------------------------------------------------------------------------- k. latest epoch
def test_no_positive_resampling_uses_the_latest_epochs_pass_rate(store, new_job):
    job = new_job(num_prompts=1, max_staleness=100, prompts_per_batch=100, threshold=0.9)
    for rewards in ([0.0] * 8, [1.0] * 4 + [0.0] * 4):  # epochs 1 and 2: below the threshold
        lease = store.lease_prompts(job, "g", 1)
        store.write_groups([make_group(job, lease.prompts[0], lease.lease_id, rewards=rewards)])
    assert store.stats(job).retired_prompts == 0
    lease = store.lease_prompts(job, "g", 1)
    assert lease.prompts[0].epoch == 3
    store.write_groups([make_group(job, lease.prompts[0], lease.lease_id, rewards=[1.0] * 9 + [0.0])])  # 0.9
    # lifetime 13/26 = 0.5; the current policy solves it 9 times in 10: retired
    assert store.pass_rate(job, lease.prompts[0].prompt_id) == (13, 26)
    assert store.stats(job).retired_prompts == 1
    assert store.lease_prompts(job, "g", 1).exhausted


def test_without_no_positive_resampling_a_solved_prompt_comes_back_every_epoch(store, new_job):
    job = new_job(num_prompts=1, max_staleness=100, prompts_per_batch=100, threshold=None)
    for epoch in (1, 2, 3):
        lease = store.lease_prompts(job, "g", 1)
        assert not lease.exhausted and lease.prompts[0].epoch == epoch
        store.write_groups([make_group(job, lease.prompts[0], lease.lease_id, rewards=[1.0] * 8)])
    assert store.stats(job).retired_prompts == 0
    assert store.pass_rate(job, lease.prompts[0].prompt_id) == (24, 24)


def _write_lease(store, job, lease, failing=()):
    """Write every leased prompt's group: 0/8 for the ids in `failing`, 8/8 (solved: retired) for the rest."""
    store.write_groups([make_group(job, p, lease.lease_id, rewards=[0.0 if p.prompt_id in failing else 1.0] * 8)
                        for p in lease.prompts])


def _retire_all(store, job, n):
    _write_lease(store, job, store.lease_prompts(job, "g", n))


def test_a_recheck_returns_a_retired_prompt_the_policy_now_fails_to_the_pool(store, new_job):
    job = new_job(num_prompts=2, max_staleness=100, prompts_per_batch=100, threshold=0.9, recheck=1.0)
    lease = store.lease_prompts(job, "g", 2)
    solved, forgotten = lease.prompts
    store.write_groups([make_group(job, solved, lease.lease_id, rewards=[1.0] * 8),
                        make_group(job, forgotten, lease.lease_id, rewards=[1.0] * 7 + [0.0])])
    assert store.stats(job).retired_prompts == 1
    lease = store.lease_prompts(job, "g", 2)  # epoch 2: the live prompt and the retired one, as a recheck
    assert {p.epoch for p in lease.prompts} == {2}
    assert {p.prompt_id for p in lease.prompts} == {solved.prompt_id, forgotten.prompt_id}
    by_id = {p.prompt_id: p for p in lease.prompts}
    store.write_groups([make_group(job, by_id[solved.prompt_id], lease.lease_id, rewards=[1.0] * 4 + [0.0] * 4),
                        make_group(job, by_id[forgotten.prompt_id], lease.lease_id, rewards=[1.0] * 8)])
    snap = store.snapshot(job)  # the first is forgotten and back in the pool; the second retired now
    assert (snap.retired_prompts, snap.unretired) == (1, 1)
    lease = store.lease_prompts(job, "g", 2)
    assert [(p.prompt_id, p.epoch) for p in lease.prompts if p.prompt_id == solved.prompt_id] == [
        (solved.prompt_id, 3)]


def test_without_rechecks_retirement_is_for_good(store, new_job):
    job = new_job(num_prompts=4, max_staleness=100, prompts_per_batch=100, threshold=0.9)
    _retire_all(store, job, 3)
    lease = store.lease_prompts(job, "g", 4)
    assert len(lease.prompts) == 1 and lease.prompts[0].epoch == 1  # the 4th, never leased before
    store.write_groups([make_group(job, lease.prompts[0], lease.lease_id, rewards=[0.0] * 8)])
    lease = store.lease_prompts(job, "g", 4)
    assert len(lease.prompts) == 1 and lease.prompts[0].epoch == 2


def test_rechecks_draw_the_given_share_of_the_retired_reproducibly(store, new_job):
    drawn = []
    job_id = f"t-recheck-{uuid.uuid4().hex[:8]}"
    for _ in range(2):  # the same job twice: the draw follows from the job's shuffle seed and the epoch
        store.cleanup_job(job_id)
        job = new_job(num_prompts=401, max_staleness=1000, prompts_per_batch=1000, threshold=0.9, recheck=0.25,
                      job_id=job_id)
        lease = store.lease_prompts(job, "g", 401)
        live = lease.prompts[-1]
        _write_lease(store, job, lease, failing={live.prompt_id})
        lease = store.lease_prompts(job, "g", 401)
        ids = {p.prompt_id for p in lease.prompts} - {live.prompt_id}
        assert live.prompt_id in {p.prompt_id for p in lease.prompts}
        drawn.append(ids)
    assert 60 <= len(drawn[0]) <= 140  # 400 retired x 0.25 = 100 expected; sd 8.7
    assert drawn[0] == drawn[1]


def _epoch_with_rechecks(store, job, live_id):
    """Lease one whole epoch; the live prompt fails, every recheck still solves -> the rechecked ids."""
    lease = store.lease_prompts(job, "g", 10_000)
    _write_lease(store, job, lease, failing={live_id})
    return {p.prompt_id for p in lease.prompts} - {live_id}


def test_each_epoch_draws_its_rechecks_afresh(store, new_job):
    # over 40 epochs at 1 in 4, every retired prompt comes up (400 x (3/4)^40 = 0.004 left out by independent
    # draws). A draw from the shuffle's generator, seeded linearly in the epoch, only rotated each prompt's number
    # by a fixed step, and left the prompts with a small step out for dozens of epochs (1.5 % of them over 40).
    job = new_job(num_prompts=401, max_staleness=10_000, prompts_per_batch=10_000, threshold=0.9, recheck=0.25,
                  job_id="t-recheck-epochs")
    lease = store.lease_prompts(job, "g", 401)
    live = lease.prompts[0].prompt_id
    _write_lease(store, job, lease, failing={live})
    draws = [_epoch_with_rechecks(store, job, live) for _ in range(40)]
    assert store.snapshot(job).retired_prompts == 400
    assert 0.8 * 100 <= sum(map(len, draws)) / len(draws) <= 1.2 * 100
    assert len(set().union(*draws)) == 400


def test_a_recheck_whose_lease_expires_goes_back_into_its_epoch(store, new_job):
    job = new_job(num_prompts=2, max_staleness=100, prompts_per_batch=100, threshold=0.9, recheck=1.0)
    lease = store.lease_prompts(job, "g", 2)
    retired, live = lease.prompts
    store.write_groups([make_group(job, retired, lease.lease_id, rewards=[1.0] * 8),
                        make_group(job, live, lease.lease_id, rewards=[0.0] * 8)])
    lease = store.lease_prompts(job, "g", 2, lease_seconds=0.2)  # epoch 2: the live prompt and the recheck
    assert len(lease.prompts) == 2
    time.sleep(0.4)
    again = store.lease_prompts(job, "g2", 2)
    assert sorted((p.prompt_id, p.epoch) for p in again.prompts) == sorted(
        [(retired.prompt_id, 2), (live.prompt_id, 2)])


def test_the_recheck_set_holds_only_the_current_epochs_draws(store, new_job, r):
    job = new_job(num_prompts=2, max_staleness=100, prompts_per_batch=100, threshold=0.9, recheck=1.0)
    lease = store.lease_prompts(job, "g", 2)
    first, second = lease.prompts
    store.write_groups([make_group(job, first, lease.lease_id, rewards=[1.0] * 8),
                        make_group(job, second, lease.lease_id, rewards=[0.0] * 8)])
    lease = store.lease_prompts(job, "g", 2)  # epoch 2: `first` rechecked and forgotten, `second` solved
    by_id = {p.prompt_id: p for p in lease.prompts}
    store.write_groups([make_group(job, by_id[first.prompt_id], lease.lease_id, rewards=[0.0] * 8),
                        make_group(job, by_id[second.prompt_id], lease.lease_id, rewards=[1.0] * 8)])
    assert r.smembers(store.prefix(job) + "recheck") == {first.prompt_id.encode()}
    store.lease_prompts(job, "g", 2)  # epoch 3: `first` is live; `second` is the recheck
    assert r.smembers(store.prefix(job) + "recheck") == {second.prompt_id.encode()}


def test_a_pool_whose_every_prompt_is_retired_is_exhausted_with_rechecks_still_queued(store, new_job, r):
    job = new_job(num_prompts=4, max_staleness=100, prompts_per_batch=100, threshold=0.9, recheck=1.0,
                  job_id="t-exhausted-rechecks")
    lease = store.lease_prompts(job, "g", 4)
    live = lease.prompts[0]
    _write_lease(store, job, lease, failing={live.prompt_id})
    lease = store.lease_prompts(job, "g", 1)  # epoch 2 starts: 1 live + 3 rechecks queued, one leased
    while lease.prompts and lease.prompts[0].prompt_id != live.prompt_id:
        store.write_groups([make_group(job, lease.prompts[0], lease.lease_id, rewards=[1.0] * 8)])
        lease = store.lease_prompts(job, "g", 1)
    store.write_groups([make_group(job, lease.prompts[0], lease.lease_id, rewards=[1.0] * 8)])  # solved at last
    assert r.llen(store.prefix(job) + "avail") >= 1  # this job's shuffle leaves rechecks after the live prompt
    assert store.lease_prompts(job, "g", 4).exhausted


def test_latest_epoch_adds_up_its_groups_and_ignores_older_epochs(store, new_job):
    from scalerl.v1 import common_pb2
    job = new_job(num_prompts=1, max_staleness=100, prompts_per_batch=100, threshold=0.9)
    pid = store.lease_prompts(job, "g", 1).prompts[0].prompt_id

    def write(epoch, rewards):
        prompt = common_pb2.Prompt(job_id=job, prompt_id=pid, epoch=epoch)
        store.write_groups([make_group(job, prompt, rewards=rewards)])
        return store.stats(job).retired_prompts

    assert write(2, [1.0] * 4 + [0.0] * 4) == 0
    assert write(2, [1.0] * 4) == 0  # epoch 2: 8/12, not the last group's 4/4
    assert write(1, [1.0] * 8) == 0  # a late group of epoch 1 only updates the lifetime history
    assert store.pass_rate(job, pid) == (16, 20)
    assert write(3, [1.0] * 9 + [0.0]) == 1
