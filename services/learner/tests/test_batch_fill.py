"""The learner's batch fill against a real replay-buffer (gRPC + Valkey) with a short claim timeout: a fill slower
than the timeout never puts one group twice into a step, and a restarted learner takes over the entries its
predecessor read and never acknowledged (issue 14 c)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis

from scalerl.recipe import Recipe
from scalerl.settings import Settings
from scalerl.v1 import common_pb2
from scalerl_learner.runner import JobRunner
from scalerl_replay_buffer.store import BufferStore
from scalerl_replay_buffer.testing import redis_url, start_buffer_server  # noqa: F401  (fixture)

CLAIM_IDLE_MS = 300


@pytest.fixture
def buffer(redis_url):
    client = redis.Redis.from_url(redis_url)
    server = start_buffer_server(client, claim_idle_ms=CLAIM_IDLE_MS)
    yield f"127.0.0.1:{server.grpc_port}", BufferStore(client)
    server.stop(0)
    client.close()


def group(job_id: str, prompt_id: str) -> common_pb2.ScoredGroup:
    completions = [common_pb2.ScoredCompletion(
        completion=common_pb2.Completion(token_ids=[1, 2], logprobs=[-0.5, -0.5], loss_mask=[True, True],
                                         versions=[common_pb2.VersionSpan(version=0, start=0, end=2)]),
        reward=r, grade_status=common_pb2.GRADE_STATUS_GRADED) for r in (1.0, 0.0)]
    return common_pb2.ScoredGroup(job_id=job_id, group_id=uuid.uuid4().hex, completions=completions,
                                  prompt=common_pb2.Prompt(job_id=job_id, prompt_id=prompt_id))


def make_runner(addr: str, store: BufferStore, tmp_path, job_id: str | None = None) -> JobRunner:
    recipe = Recipe(pipeline={"prompts_per_batch": 4}, task={"num_train_prompts": 16})
    job_id = job_id or f"bf-{uuid.uuid4().hex[:10]}"
    store.init_job(job_id, recipe)
    settings = Settings(data_dir=tmp_path, replay_buffer_addr=addr, control_plane_addr="127.0.0.1:1",
                        forecaster_addr="127.0.0.1:1", evaluator_addr="127.0.0.1:1",
                        weight_transport={"type": "filesystem", "root": str(tmp_path / "w")})
    return JobRunner(settings, common_pb2.Job(job_id=job_id, recipe_json=recipe.model_dump_json()),
                     control=None, stop=threading.Event())


def test_slow_batch_fill_never_holds_a_group_twice(buffer, tmp_path):
    addr, store = buffer
    runner = make_runner(addr, store, tmp_path)
    job = runner.job_id
    store.write_groups([group(job, f"train-{i}") for i in range(2)])
    # the other half arrives after several claim timeouts: the first two sit pending at this learner meanwhile
    threading.Timer(1.5, lambda: store.write_groups([group(job, f"train-{i}") for i in range(2, 4)])).start()
    groups, entries = runner.next_batch()
    assert len(groups) == 4
    assert len(set(entries)) == 4 and len({g.group_id for g in groups}) == 4
    store.ack(job, entries)
    s = store.snapshot(job)
    assert (s.trained, s.pending) == (4, 0)
    runner.close()


def test_restarted_learner_takes_over_unacknowledged_entries(buffer, tmp_path):
    addr, store = buffer
    dead = make_runner(addr, store, tmp_path)
    job = dead.job_id
    store.write_groups([group(job, f"train-{i}") for i in range(4)])
    _, read_by_dead = dead.next_batch()  # then the process dies before its step acknowledges them
    dead.close()
    time.sleep(CLAIM_IDLE_MS / 1000 + 0.2)
    restarted = make_runner(addr, store, tmp_path, job_id=job)  # same settings, new process
    _, entries = restarted.next_batch()
    assert sorted(entries) == sorted(read_by_dead)
    restarted.close()


def test_an_exhausted_pool_ends_the_fill_with_what_is_left(buffer, tmp_path):
    """Every prompt retired (No-Positive-Resampling) and none leased: no group can come any more, so the fill
    returns the groups in hand instead of starving forever, and the runner knows the job must end."""
    addr, store = buffer
    runner = make_runner(addr, store, tmp_path)
    job = runner.job_id
    lease = store.lease_prompts(job, "gen-0", 64)
    assert len(lease.prompts) == 16
    solved = []
    for p in lease.prompts:  # every completion correct: pass rate 1.0 >= 0.9 retires the prompt
        g = group(job, p.prompt_id)
        g.prompt.CopyFrom(p)
        g.lease_id = lease.lease_id
        for c in g.completions:
            c.reward = 1.0
        solved.append(g)
    store.write_groups(solved)
    store.write_groups([group(job, "late-0")])  # one trainable group still in the stream
    st = store.stats(job)
    assert (st.pool_size, st.leased) == (0, 0)
    groups, entries = runner.next_batch()
    assert len(groups) == 1 and runner.exhausted
    store.ack(job, entries)
    runner.close()


def test_a_pool_with_prompts_left_keeps_the_learner_waiting(buffer, tmp_path):
    addr, store = buffer
    runner = make_runner(addr, store, tmp_path)
    store.write_groups([group(runner.job_id, "train-0")])
    threading.Timer(7.0, lambda: store.write_groups([group(runner.job_id, f"train-{i}") for i in range(1, 4)])).start()
    runner.control = type("Control", (), {"report": staticmethod(lambda progress: True)})()
    groups, _ = runner.next_batch()  # waits past the 5 s check: the pool still has prompts
    assert len(groups) == 4 and not runner.exhausted
    runner.close()
