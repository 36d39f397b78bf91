"""The ReplayBuffer gRPC service through a real grpc server on 127.0.0.1 (the service bootstrap's, with its
error interceptor), and the Prometheus collector."""

from __future__ import annotations

import uuid

import grpc
import redis
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from buffer_testlib import CLAIM_IDLE_MS, make_group
from scalerl.ports import unused_port
from scalerl.recipe import Recipe
from scalerl.serving import ServiceRegistration, start_server
from scalerl.v1 import common_pb2, replay_buffer_pb2 as pb, replay_buffer_pb2_grpc
from scalerl_replay_buffer.metrics import register_metrics
from scalerl_replay_buffer.service import add_to_server


def serve(redis_client):
    """A running server over `redis_client` -> (RunningServer, ReplayBufferService)."""
    services = []
    registration = ServiceRegistration(["scalerl.v1.ReplayBuffer"], lambda s: services.append(
        add_to_server(s, redis_client, claim_idle_ms=CLAIM_IDLE_MS)))
    running = start_server(registration, host="127.0.0.1", grpc_port=0, metrics_port=None, max_workers=8)
    return running, services[0]


@pytest.fixture
def stub(r):
    running, service = serve(r)
    channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
    yield replay_buffer_pb2_grpc.ReplayBufferStub(channel), service
    channel.close()
    running.stop(0)


@pytest.fixture
def job(stub):
    stub, _ = stub
    job_id = f"svc-{uuid.uuid4().hex[:12]}"
    recipe = Recipe(task={"num_train_prompts": 12}, pipeline={"max_staleness": 1, "prompts_per_batch": 4})
    yield job_id, recipe
    stub.CleanupJob(pb.CleanupJobRequest(job_id=job_id))


def test_full_flow_over_grpc(stub, job):
    stub, _ = stub
    job_id, recipe = job
    init = stub.InitJob(pb.InitJobRequest(job=common_pb2.Job(job_id=job_id, recipe_json=recipe.model_dump_json())))
    assert (init.pool_size, init.created) == (12, True)
    again = stub.InitJob(pb.InitJobRequest(job=common_pb2.Job(job_id=job_id, recipe_json=recipe.model_dump_json())))
    assert (again.pool_size, again.created) == (12, False)

    lease = stub.LeasePrompts(pb.LeasePromptsRequest(job_id=job_id, generator_id="gen-0", max_prompts=4))
    assert len(lease.prompts) == 4 and lease.lease_id and not lease.slow_down
    assert all(p.job_id == job_id and p.text and p.answer and p.epoch == 1 for p in lease.prompts)
    groups = [make_group(job_id, p, lease.lease_id, rewards=(1.0, 0.0), version=2) for p in lease.prompts]
    groups[3] = make_group(job_id, lease.prompts[3], lease.lease_id, rewards=(0.0, 0.0), version=2)
    w = stub.WriteGroups(pb.WriteGroupsRequest(groups=groups))
    assert (w.written, w.dropped_zero_variance, w.dropped_failed_to_grade) == (3, 1, 0)
    assert stub.WriteGroups(pb.WriteGroupsRequest(groups=groups)).written == 0  # retried RPC

    batch = stub.ReadBatch(pb.ReadBatchRequest(job_id=job_id, consumer="learner", max_groups=8, learner_version=2))
    assert len(batch.groups) == 3 and batch.dropped_stale == 0
    assert {b.group.group_id for b in batch.groups} == {g.group_id for g in groups[:3]}
    assert list(batch.groups[0].group.completions[0].completion.logprobs) == [-0.5] * 4
    ack = stub.Ack(pb.AckRequest(job_id=job_id, entry_ids=[b.entry_id for b in batch.groups], trained=True))
    assert ack.acked == 3

    s = stub.GetStats(pb.GetStatsRequest(job_id=job_id))
    assert (s.job_id, s.groups_written, s.groups_trained, s.dropped_zero_variance, s.pending) == (job_id, 4, 3, 1, 0)
    assert (s.pool_size, s.epoch, s.generated_tokens) == (12, 1, 4 * 2 * 4)
    assert s.generator_device_seconds == pytest.approx(2.0)
    assert stub.CleanupJob(pb.CleanupJobRequest(job_id=job_id)).keys_deleted > 5
    with pytest.raises(grpc.RpcError) as err:
        stub.GetStats(pb.GetStatsRequest(job_id=job_id))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def _code_and_details(call):
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def test_invalid_arguments_name_the_field(stub, job):
    stub, _ = stub
    job_id, recipe = job
    stub.InitJob(pb.InitJobRequest(job=common_pb2.Job(job_id=job_id, recipe_json=recipe.model_dump_json())))
    INVALID = grpc.StatusCode.INVALID_ARGUMENT
    cases = [
        (lambda: stub.InitJob(pb.InitJobRequest(job=common_pb2.Job(recipe_json="{}"))), INVALID, "job.job_id"),
        (lambda: stub.InitJob(pb.InitJobRequest(job=common_pb2.Job(job_id="x", recipe_json="{not json"))),
         INVALID, "job.recipe_json"),
        (lambda: stub.InitJob(pb.InitJobRequest(job=common_pb2.Job(
            job_id="x", recipe_json='{"pipeline": {"max_staleness": -1}}'))), INVALID, "max_staleness"),
        (lambda: stub.InitJob(pb.InitJobRequest(job=common_pb2.Job(job_id="a:b", recipe_json="{}"))),
         INVALID, "job.job_id"),
        (lambda: stub.InitJob(pb.InitJobRequest(job=common_pb2.Job(job_id="x", recipe_json=Recipe(
            task={"name": "reasoning_gym/no_such_dataset", "num_train_prompts": 4}).model_dump_json()))),
         INVALID, "job.recipe_json.task"),
        (lambda: stub.InitJob(pb.InitJobRequest(job=common_pb2.Job(
            job_id=job_id, recipe_json=Recipe().model_dump_json()))), grpc.StatusCode.FAILED_PRECONDITION,
         "recipe_json"),
        (lambda: stub.LeasePrompts(pb.LeasePromptsRequest(generator_id="g", max_prompts=1)), INVALID, "job_id"),
        (lambda: stub.LeasePrompts(pb.LeasePromptsRequest(job_id=job_id, generator_id="g", max_prompts=0)),
         INVALID, "max_prompts"),
        (lambda: stub.LeasePrompts(pb.LeasePromptsRequest(job_id=job_id, max_prompts=1)), INVALID, "generator_id"),
        (lambda: stub.LeasePrompts(pb.LeasePromptsRequest(job_id="unknown-job", generator_id="g", max_prompts=1)),
         grpc.StatusCode.NOT_FOUND, "job_id"),
        (lambda: stub.ReadBatch(pb.ReadBatchRequest(job_id=job_id, max_groups=1)), INVALID, "consumer"),
        (lambda: stub.ReadBatch(pb.ReadBatchRequest(job_id=job_id, consumer="c")), INVALID, "max_groups"),
        (lambda: stub.Ack(pb.AckRequest(job_id=job_id, entry_ids=["1-0", "x"])), INVALID, "entry_ids[1]"),
        (lambda: stub.WriteGroups(pb.WriteGroupsRequest(groups=[make_group("", "train-0")])),
         INVALID, "groups[0].job_id"),
        (lambda: stub.WriteGroups(pb.WriteGroupsRequest(groups=[make_group("unknown-job", "train-0")])),
         grpc.StatusCode.NOT_FOUND, "unknown-job"),
        (lambda: stub.GetStats(pb.GetStatsRequest()), INVALID, "job_id"),
        (lambda: stub.CleanupJob(pb.CleanupJobRequest()), INVALID, "job_id"),
    ]
    for call, code, field in cases:
        got_code, details = _code_and_details(call)
        assert (got_code, field in details) == (code, True), (field, got_code, details)


def test_metrics_are_read_from_redis(stub, job):
    stub, service = stub
    job_id, recipe = job
    stub.InitJob(pb.InitJobRequest(job=common_pb2.Job(job_id=job_id, recipe_json=recipe.model_dump_json())))
    lease = stub.LeasePrompts(pb.LeasePromptsRequest(job_id=job_id, generator_id="g", max_prompts=3))
    p = lease.prompts
    stub.WriteGroups(pb.WriteGroupsRequest(groups=[
        make_group(job_id, p[0], lease.lease_id, rewards=(1.0, 1.0)),  # zero variance, retires p[0]
        make_group(job_id, p[1], lease.lease_id, rewards=(1.0, 0.0), failed=(0,), version=0),
        make_group(job_id, p[2], lease.lease_id, rewards=(1.0, 0.0), version=0),
    ]))
    stub.ReadBatch(pb.ReadBatchRequest(job_id=job_id, consumer="c", max_groups=1, learner_version=5))  # stale
    stub.WriteGroups(pb.WriteGroupsRequest(groups=[make_group(job_id, "train-9", rewards=(1.0, 0.0), version=3)]))

    registry = CollectorRegistry()
    register_metrics(service.store, registry)  # discovers jobs by SCAN
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(generate_latest(registry).decode())
               for s in fam.samples if s.labels.get("job_id") == job_id}
    j = (("job_id", job_id),)
    assert samples[("scalerl_buffer_groups_written_total", j)] == 4
    assert samples[("scalerl_buffer_groups_trained_total", j)] == 0
    for reason in ("stale", "zero_variance", "failed_to_grade"):
        assert samples[("scalerl_buffer_groups_dropped_total", (("job_id", job_id), ("reason", reason)))] == 1
    assert samples[("scalerl_buffer_backlog_groups", j)] == 1  # one unread group, no open lease
    assert samples[("scalerl_buffer_oldest_pending_version_lag", j)] == 2  # learner 5, oldest pending 3
    assert samples[("scalerl_buffer_pool_prompts", j)] == 11
    assert samples[("scalerl_buffer_retired_prompts", j)] == 1
    assert samples[("scalerl_buffer_prompt_epoch", j)] == 1
    assert samples[("scalerl_buffer_prompts_unretired_total", j)] == 0


def test_redis_down_is_unavailable():
    """Nothing listens where the store's Redis should be: every call is UNAVAILABLE (retry later), not INTERNAL."""
    client = redis.Redis(host="127.0.0.1", port=unused_port(), socket_connect_timeout=0.5)
    running, _ = serve(client)
    channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
    try:
        stub = replay_buffer_pb2_grpc.ReplayBufferStub(channel)
        code, details = _code_and_details(lambda: stub.GetStats(pb.GetStatsRequest(job_id="any-job")))
        assert code == grpc.StatusCode.UNAVAILABLE and details.startswith("redis: ")
        code, _ = _code_and_details(lambda: stub.InitJob(pb.InitJobRequest(job=common_pb2.Job(
            job_id="any-job", recipe_json=Recipe().model_dump_json()))))
        assert code == grpc.StatusCode.UNAVAILABLE
    finally:
        channel.close()
        running.stop(0)
        client.close()
