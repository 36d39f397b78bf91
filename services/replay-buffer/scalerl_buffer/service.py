"""gRPC ReplayBuffer service: a stateless wrapper of BufferStore (replicas share one Redis)."""

from __future__ import annotations

import functools
import logging

import grpc
import pydantic
import redis

from scalerl.recipe import parse_recipe
from scalerl.v1 import replay_buffer_pb2, replay_buffer_pb2_grpc

from .store import BufferStore, JobNotFound, RecipeConflict

log = logging.getLogger(__name__)

MAX_BLOCK_MS = 30_000


def _rpc(method):
    """Map store errors onto gRPC status codes; the message names the offending field."""

    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except JobNotFound as err:
            context.abort(grpc.StatusCode.NOT_FOUND, str(err))
        except RecipeConflict as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except redis.RedisError as err:
            log.warning("%s: redis error: %s", method.__name__, err)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"redis: {err}")

    return wrapper


def _require(value, field: str) -> None:
    if not value:
        raise ValueError(f"{field} is required")


class ReplayBufferService(replay_buffer_pb2_grpc.ReplayBufferServicer):
    def __init__(self, store: BufferStore):
        self.store = store

    @_rpc
    def InitJob(self, request, context):
        job = request.job
        _require(job.job_id, "job.job_id")
        self.store.check_job_id(job.job_id, "job.job_id")
        _require(job.recipe_json, "job.recipe_json")
        try:
            recipe = parse_recipe(job.recipe_json)
        except pydantic.ValidationError as err:
            raise ValueError(f"job.recipe_json is malformed: {err}") from None
        pool_size, created = self.store.init_job(job.job_id, recipe)
        return replay_buffer_pb2.InitJobResponse(pool_size=pool_size, created=created)

    @_rpc
    def LeasePrompts(self, request, context):
        _require(request.job_id, "job_id")
        _require(request.generator_id, "generator_id")
        if request.max_prompts <= 0:
            raise ValueError("max_prompts must be > 0")
        if request.lease_seconds < 0:
            raise ValueError("lease_seconds must be >= 0 (0: the recipe's data.lease_seconds)")
        res = self.store.lease_prompts(request.job_id, request.generator_id, request.max_prompts,
                                       request.lease_seconds or None)
        return replay_buffer_pb2.LeasePromptsResponse(prompts=res.prompts, lease_id=res.lease_id,
                                                      slow_down=res.slow_down, retry_after_s=res.retry_after_s,
                                                      exhausted=res.exhausted)

    @_rpc
    def WriteGroups(self, request, context):
        res = self.store.write_groups(list(request.groups))
        return replay_buffer_pb2.WriteGroupsResponse(written=res.written,
                                                     dropped_zero_variance=res.dropped_zero_variance,
                                                     dropped_failed_to_grade=res.dropped_failed_to_grade)

    @_rpc
    def ReadBatch(self, request, context):
        _require(request.job_id, "job_id")
        _require(request.consumer, "consumer")
        if request.max_groups <= 0:
            raise ValueError("max_groups must be > 0")
        if request.block_ms < 0:
            raise ValueError("block_ms must be >= 0")
        return self.store.read_batch_response(request.job_id, request.consumer, request.max_groups,
                                              request.learner_version, min(request.block_ms, MAX_BLOCK_MS))

    @_rpc
    def Ack(self, request, context):
        _require(request.job_id, "job_id")
        return replay_buffer_pb2.AckResponse(acked=self.store.ack(request.job_id, list(request.entry_ids),
                                                                  request.trained))

    @_rpc
    def GetStats(self, request, context):
        _require(request.job_id, "job_id")
        return self.store.stats(request.job_id)

    @_rpc
    def CleanupJob(self, request, context):
        _require(request.job_id, "job_id")
        return replay_buffer_pb2.CleanupJobResponse(keys_deleted=self.store.cleanup_job(request.job_id))


def add_to_server(server: grpc.Server, redis_client: redis.Redis, **store_kwargs) -> ReplayBufferService:
    """Register a ReplayBufferService on `server` over `redis_client` (store_kwargs go to BufferStore)."""
    service = ReplayBufferService(BufferStore(redis_client, **store_kwargs))
    replay_buffer_pb2_grpc.add_ReplayBufferServicer_to_server(service, server)
    return service
