"""Generator gRPC servicer (thin): decode, ask the replica (`jobs.Generator`), encode. Errors are
scalerl.errors, mapped to status codes by the bootstrap's interceptor."""

from __future__ import annotations

from scalerl.v1 import generator_pb2, generator_pb2_grpc
from scalerl_generator.jobs import Generator


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
                                       request.samples_per_prompt)
