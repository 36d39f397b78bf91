"""The ReplayBuffer gRPC servicer: a stateless, thin wrapper of BufferStore (replicas share one Redis).

Errors are the store's `scalerl.errors` classes; the server's interceptor maps them to status codes."""

from __future__ import annotations

import grpc
import redis

from scalerl import errors
from scalerl.v1 import replay_buffer_pb2, replay_buffer_pb2_grpc

from .store import BufferStore, parse_recipe_field

MAX_BLOCK_MS = 30_000


class ReplayBufferService(replay_buffer_pb2_grpc.ReplayBufferServicer):
    def __init__(self, store: BufferStore):
        self.store = store

    def InitJob(self, request, context):
        job = request.job
        self.store.check_job_id(job.job_id, "job.job_id")
        if not job.recipe_json:
            raise errors.InvalidArgument("is required", field="job.recipe_json", job_id=job.job_id)
        recipe = parse_recipe_field(job.recipe_json, "job.recipe_json", job.job_id)
        pool_size, created = self.store.init_job(job.job_id, recipe)
        return replay_buffer_pb2.InitJobResponse(pool_size=pool_size, created=created)

    def LeasePrompts(self, request, context):
        res = self.store.lease_prompts(request.job_id, request.generator_id, request.max_prompts,
                                       request.lease_seconds or None)
        return replay_buffer_pb2.LeasePromptsResponse(prompts=res.prompts, lease_id=res.lease_id,
                                                      slow_down=res.slow_down, retry_after_s=res.retry_after_s,
                                                      exhausted=res.exhausted)

    def RenewLeases(self, request, context):
        lost = self.store.renew_leases(request.job_id, request.lease_id, list(request.prompt_ids),
                                       request.lease_seconds or None)
        return replay_buffer_pb2.RenewLeasesResponse(lost_prompt_ids=lost)

    def WriteGroups(self, request, context):
        res = self.store.write_groups(list(request.groups))
        return replay_buffer_pb2.WriteGroupsResponse(written=res.written,
                                                     dropped_zero_variance=res.dropped_zero_variance,
                                                     dropped_failed_to_grade=res.dropped_failed_to_grade,
                                                     lost_lease=res.lost_lease)

    def ReadBatch(self, request, context):
        return self.store.read_batch_response(request.job_id, request.consumer, request.max_groups,
                                              request.learner_version, min(request.block_ms, MAX_BLOCK_MS))

    def Ack(self, request, context):
        return replay_buffer_pb2.AckResponse(acked=self.store.ack(request.job_id, list(request.entry_ids),
                                                                  request.trained))

    def GetStats(self, request, context):
        return self.store.stats(request.job_id)

    def CleanupJob(self, request, context):
        return replay_buffer_pb2.CleanupJobResponse(keys_deleted=self.store.cleanup_job(request.job_id))


def add_to_server(server: grpc.Server, redis_client: redis.Redis, **store_kwargs) -> ReplayBufferService:
    """Register a ReplayBufferService on `server` over `redis_client` (store_kwargs go to BufferStore)."""
    service = ReplayBufferService(BufferStore(redis_client, **store_kwargs))
    replay_buffer_pb2_grpc.add_ReplayBufferServicer_to_server(service, server)
    return service
