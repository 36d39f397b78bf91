"""Generator gRPC servicer (thin): decode, ask the replica (`jobs.Generator`), encode. Errors are
scalerl.errors, mapped to status codes by the bootstrap's interceptor. Readiness follows the vLLM engine."""

from __future__ import annotations

from collections.abc import Callable

from scalerl.serving import RunningServer, health_pb2  # the health protocol the shared bootstrap serves
from scalerl.v1 import generator_pb2, generator_pb2_grpc
from scalerl_generator import metrics
from scalerl_generator.engine import on_engine_state
from scalerl_generator.jobs import Generator

ENGINE_HEALTH_NAME = "scalerl.v1.Generator.Engine"
"""gRPC health name of readiness (the pod's readinessProbe): NOT_SERVING while a job's vLLM engine loads or after
it failed, SERVING once it is loaded and while idle (the engine is built per job, from the job's recipe, so an
idle generator has nothing to load). The overall status "" stays SERVING: liveness holds during a long load."""


def engine_serving(state: str) -> bool:
    """Readiness for an engine state of scalerl_generator.engine (loading, ready, stopped, failed)."""
    return state in ("ready", "stopped")


def track_engine_readiness(running: RunningServer) -> Callable[[], None]:
    """Make ENGINE_HEALTH_NAME (and scalerl_generator_engine_ready) follow this process's engine, starting idle
    (SERVING); returns the unsubscribe."""
    def follow(state: str) -> None:
        metrics.ENGINE_READY.set(1 if state == "ready" else 0)
        running.health.set(ENGINE_HEALTH_NAME, health_pb2.HealthCheckResponse.SERVING if engine_serving(state)
                           else health_pb2.HealthCheckResponse.NOT_SERVING)

    follow("stopped")
    return on_engine_state(follow)


class GeneratorServicer(generator_pb2_grpc.GeneratorServicer):
    def __init__(self, generator: Generator):
        self.generator = generator

    def GetStatus(self, request, context):
        s = self.generator.state()
        return generator_pb2.GeneratorStatus(generator_id=s.generator_id, role=s.role, job_id=s.job_id,
                                             policy_version=s.policy_version,
                                             groups_in_flight=s.groups_in_flight,
                                             tokens_generated=s.tokens_generated)

    def Evaluate(self, request, context):
        return self.generator.evaluate(request.job_id, request.policy_version, request.num_prompts,
                                       request.samples_per_prompt, request.eval_set)
