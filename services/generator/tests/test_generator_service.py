"""The Generator servicer through a real gRPC server with the bootstrap's error interceptor: status of an idle
replica, and Evaluate's refusals as status codes naming the field."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from scalerl.serving import GRPC_OPTIONS, ErrorInterceptor
from scalerl.v1 import generator_pb2, generator_pb2_grpc
from scalerl_generator.jobs import Generator
from scalerl_generator.service import GeneratorServicer


@pytest.fixture
def serve():
    servers, channels = [], []

    def start(role: str) -> generator_pb2_grpc.GeneratorStub:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=GRPC_OPTIONS,
                             interceptors=[ErrorInterceptor()])
        generator_pb2_grpc.add_GeneratorServicer_to_server(GeneratorServicer(Generator(f"{role}-1", role)), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        channels.append(grpc.insecure_channel(f"127.0.0.1:{port}"))
        return generator_pb2_grpc.GeneratorStub(channels[-1])

    yield start
    for c in channels:
        c.close()
    for s in servers:
        s.stop(0)


def test_idle_replica_status(serve):
    status = serve("rollout").GetStatus(generator_pb2.GeneratorStatusRequest(), timeout=5)
    assert (status.generator_id, status.role, status.job_id, status.policy_version) == ("rollout-1", "rollout", "", 0)


@pytest.mark.parametrize("role,request_fields,code,details", [
    ("rollout", dict(job_id="j", num_prompts=2, samples_per_prompt=1), grpc.StatusCode.FAILED_PRECONDITION,
     "not in the evaluator role"),
    ("evaluator", dict(job_id="j", num_prompts=0, samples_per_prompt=1), grpc.StatusCode.INVALID_ARGUMENT,
     "num_prompts: must be > 0"),
    ("evaluator", dict(job_id="j", num_prompts=2, samples_per_prompt=0), grpc.StatusCode.INVALID_ARGUMENT,
     "samples_per_prompt: must be > 0"),
    ("evaluator", dict(job_id="j", num_prompts=2, samples_per_prompt=1), grpc.StatusCode.UNAVAILABLE,
     "job_id: not serving job 'j' yet"),
])
def test_evaluate_refusals(serve, role, request_fields, code, details):
    with pytest.raises(grpc.RpcError) as err:
        serve(role).Evaluate(generator_pb2.EvaluateRequest(**request_fields), timeout=5)
    assert err.value.code() == code
    assert details in err.value.details()
