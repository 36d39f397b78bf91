"""The review fixes of issue 14 through the ReplayBuffer gRPC service (the bootstrap's server, real Valkey):
No-Positive-Resampling at the paper's threshold of 0.9 on the latest epoch's pass rate (k), lease renewal and
the refused write of a lost lease (h)."""

from __future__ import annotations

import time
import uuid

import grpc
import pytest

from buffer_testlib import make_group
from scalerl.recipe import Recipe
from scalerl.v1 import common_pb2, replay_buffer_pb2 as pb, replay_buffer_pb2_grpc
from scalerl_replay_buffer.testing import start_buffer_server


@pytest.fixture
def stub(r):
    running = start_buffer_server(r)
    channel = grpc.insecure_channel(f"127.0.0.1:{running.grpc_port}")
    yield replay_buffer_pb2_grpc.ReplayBufferStub(channel)
    channel.close()
    running.stop(0)


def init(stub, recipe: Recipe) -> str:
    job_id = f"rg-{uuid.uuid4().hex[:10]}"
    stub.InitJob(pb.InitJobRequest(job=common_pb2.Job(job_id=job_id, recipe_json=recipe.model_dump_json())))
    return job_id


def test_retirement_at_090_on_the_latest_epoch_over_grpc(stub):
    recipe = Recipe(task={"num_train_prompts": 2}, pipeline={"max_staleness": 100, "prompts_per_batch": 100})
    assert recipe.data.no_positive_resampling_threshold == 0.9  # the paper's default, as the job gets it
    job = init(stub, recipe)
    try:
        def epoch(rewards_by_prompt):
            lease = stub.LeasePrompts(pb.LeasePromptsRequest(job_id=job, generator_id="g", max_prompts=2))
            prompts = sorted(lease.prompts, key=lambda p: p.prompt_id)
            stub.WriteGroups(pb.WriteGroupsRequest(groups=[
                make_group(job, p, lease.lease_id, rewards=rewards_by_prompt[i]) for i, p in enumerate(prompts)]))
            return prompts, stub.GetStats(pb.GetStatsRequest(job_id=job))

        below = [1.0] * 8 + [0.0] * 2  # 0.8
        prompts, s = epoch([[0.0] * 10, below])
        assert s.retired_prompts == 0
        prompts, s = epoch([[1.0] * 9 + [0.0], below])  # prompt 0: 0.9 in its latest epoch (lifetime 0.45)
        assert s.retired_prompts == 1 and s.pool_size == 1
        for _ in range(3):
            lease = stub.LeasePrompts(pb.LeasePromptsRequest(job_id=job, generator_id="g", max_prompts=2))
            assert [p.prompt_id for p in lease.prompts] == [prompts[1].prompt_id]
            stub.WriteGroups(pb.WriteGroupsRequest(groups=[make_group(job, lease.prompts[0], lease.lease_id,
                                                                      rewards=below)]))
    finally:
        stub.CleanupJob(pb.CleanupJobRequest(job_id=job))


def test_renewal_and_lost_lease_over_grpc(stub):
    recipe = Recipe(task={"num_train_prompts": 1}, pipeline={"max_staleness": 100, "prompts_per_batch": 100},
                    data={"lease_seconds": 0.4})
    job = init(stub, recipe)
    try:
        held = stub.LeasePrompts(pb.LeasePromptsRequest(job_id=job, generator_id="a", max_prompts=1))
        pid = held.prompts[0].prompt_id
        for _ in range(3):
            time.sleep(0.2)
            renewed = stub.RenewLeases(pb.RenewLeasesRequest(job_id=job, lease_id=held.lease_id, prompt_ids=[pid]))
            assert list(renewed.lost_prompt_ids) == []
        assert stub.LeasePrompts(pb.LeasePromptsRequest(job_id=job, generator_id="b", max_prompts=1)).prompts == []
        time.sleep(0.5)  # no renewal: the lease expires and goes to b
        taken = stub.LeasePrompts(pb.LeasePromptsRequest(job_id=job, generator_id="b", max_prompts=1))
        assert [p.prompt_id for p in taken.prompts] == [pid]
        lost = stub.RenewLeases(pb.RenewLeasesRequest(job_id=job, lease_id=held.lease_id, prompt_ids=[pid]))
        assert list(lost.lost_prompt_ids) == [pid]
        late = stub.WriteGroups(pb.WriteGroupsRequest(groups=[make_group(job, held.prompts[0], held.lease_id)]))
        assert (late.written, late.lost_lease) == (0, 1)
        s = stub.GetStats(pb.GetStatsRequest(job_id=job))
        assert (s.groups_written, s.lost_lease) == (0, 1)
        with pytest.raises(grpc.RpcError) as err:
            stub.RenewLeases(pb.RenewLeasesRequest(job_id=job, prompt_ids=[pid]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "lease_id" in err.value.details()
    finally:
        stub.CleanupJob(pb.CleanupJobRequest(job_id=job))
