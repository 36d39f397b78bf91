"""Bad gRPC input on every service, each a real process (`python -m scalerl NAME`): bytes that are no valid message
for the method answer INVALID_ARGUMENT, a message over the server's receive limit RESOURCE_EXHAUSTED, and the
service keeps serving (health, then a valid call of the same service)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf.message import Message

from scalerl.ports import unused_port
from scalerl.serving import MAX_MESSAGE_BYTES, check_health
from scalerl.v1 import (control_plane_pb2, forecaster_pb2, generator_pb2, learner_pb2, replay_buffer_pb2,
                        reward_grader_pb2, weight_broadcast_pb2)
from scalerl_replay_buffer.embedded import EmbeddedValkey

# Field 1, length-delimited, announcing 127 bytes that never come: no message type parses this.
MALFORMED = b"\x0a\x7f\x01"


@dataclass(frozen=True)
class Probe:
    service: str
    grpc_name: str
    method: str
    """A unary method the bad bytes go to."""
    valid_request: Message
    """A request of `method` that the service answers OK with no job running."""
    reply_type: type[Message]


PROBES = [
    Probe("api", "scalerl.v1.ControlPlane", "/scalerl.v1.ControlPlane/GetActiveJob",
          control_plane_pb2.GetActiveJobRequest(requester="test"), control_plane_pb2.ActiveJob),
    Probe("reward-grader", "scalerl.v1.RewardGrader", "/scalerl.v1.RewardGrader/Grade",
          reward_grader_pb2.GradeRequest(job_id="j"), reward_grader_pb2.GradeResponse),
    Probe("replay-buffer", "scalerl.v1.ReplayBuffer", "/scalerl.v1.ReplayBuffer/CleanupJob",
          replay_buffer_pb2.CleanupJobRequest(job_id="j"), replay_buffer_pb2.CleanupJobResponse),
    Probe("weight-broadcast", "scalerl.v1.WeightBroadcast", "/scalerl.v1.WeightBroadcast/GetLatest",
          weight_broadcast_pb2.GetLatestRequest(job_id="j"), weight_broadcast_pb2.VersionInfo),
    Probe("forecaster", "scalerl.v1.Forecaster", "/scalerl.v1.Forecaster/GetCurve",
          forecaster_pb2.GetCurveRequest(job_id="j"), forecaster_pb2.Curve),
    Probe("learner", "scalerl.v1.Learner", "/scalerl.v1.Learner/GetStatus",
          learner_pb2.LearnerStatusRequest(), learner_pb2.LearnerStatus),
    Probe("generator", "scalerl.v1.Generator", "/scalerl.v1.Generator/GetStatus",
          generator_pb2.GeneratorStatusRequest(), generator_pb2.GeneratorStatus),
]


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """Every service started at once (they import for seconds each), with no job and no control plane."""
    root = tmp_path_factory.mktemp("services")
    procs: dict[str, tuple[subprocess.Popen, str]] = {}
    with EmbeddedValkey(data_dir=root / "valkey") as valkey:
        try:
            for probe in PROBES:
                grpc_port = unused_port()
                env = os.environ | {
                    "SCALERL_GRPC_PORT": str(grpc_port), "SCALERL_METRICS_PORT": str(unused_port()),
                    "SCALERL_HTTP_PORT": str(unused_port()), "SCALERL_DATA_DIR": str(root / probe.service),
                    "SCALERL_DATABASE_URL": f"sqlite:///{root / 'jobs.db'}", "SCALERL_REDIS_URL": valkey.url,
                    "SCALERL_CONTROL_PLANE_ADDR": f"127.0.0.1:{unused_port()}", "SCALERL_POLL_INTERVAL_S": "5"}
                log = open(root / f"{probe.service}.log", "w")
                procs[probe.service] = (subprocess.Popen([sys.executable, "-m", "scalerl", probe.service], env=env,
                                                         stdout=log, stderr=log), f"127.0.0.1:{grpc_port}")
            deadline = time.monotonic() + 180
            for name, (proc, addr) in procs.items():
                while check_health(addr, timeout=0.5) != "SERVING":
                    assert proc.poll() is None, (root / f"{name}.log").read_text()[-3000:]
                    assert time.monotonic() < deadline, f"{name} did not start"
                    time.sleep(0.2)
            yield {name: addr for name, (_, addr) in procs.items()}
        finally:
            for proc, _ in procs.values():
                proc.terminate()
            for proc, _ in procs.values():
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()


def raw_call(addr: str, method: str, payload: bytes) -> grpc.StatusCode:
    """Send `payload` as the request of `method` as-is -> the status code the service answers."""
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(addr, options=options) as ch:
        call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            call(payload, timeout=60)
        except grpc.RpcError as err:
            return err.code()
        return grpc.StatusCode.OK


def assert_still_serving(addr: str, probe: Probe) -> None:
    assert check_health(addr) == "SERVING"
    assert check_health(addr, probe.grpc_name) == "SERVING"
    with grpc.insecure_channel(addr) as ch:
        call = ch.unary_unary(probe.method, request_serializer=probe.valid_request.__class__.SerializeToString,
                              response_deserializer=probe.reply_type.FromString)
        assert isinstance(call(probe.valid_request, timeout=30), probe.reply_type)


@pytest.mark.parametrize("probe", PROBES, ids=[p.service for p in PROBES])
def test_malformed_message_is_invalid_argument_and_the_service_keeps_serving(services, probe):
    addr = services[probe.service]
    assert raw_call(addr, probe.method, MALFORMED) == grpc.StatusCode.INVALID_ARGUMENT
    assert_still_serving(addr, probe)


@pytest.mark.parametrize("probe", PROBES, ids=[p.service for p in PROBES])
def test_oversize_message_is_resource_exhausted_and_the_service_keeps_serving(services, probe):
    addr = services[probe.service]
    assert raw_call(addr, probe.method, b"\0" * (MAX_MESSAGE_BYTES + 1)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_still_serving(addr, probe)


def test_malformed_chunk_in_a_client_stream_is_invalid_argument(services):
    addr = services["weight-broadcast"]
    with grpc.insecure_channel(addr) as ch:
        publish = ch.stream_unary("/scalerl.v1.WeightBroadcast/Publish", request_serializer=None,
                                  response_deserializer=None)
        with pytest.raises(grpc.RpcError) as err:
            publish(iter([MALFORMED]), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_still_serving(addr, PROBES[3])
