"""A learner that dies mid-run resumes from its checkpoint, and policy versions keep increasing — also when the
weight-broadcast service restarted and forgot what it had served. Real weight-broadcast server over gRPC, and a real
replay-buffer, which each publish asks for the compute spent (an unreachable one holds every publish for the call's
deadline)."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest
import redis

from scalerl.recipe import Recipe
from scalerl.settings import Settings
from scalerl.v1 import common_pb2
from scalerl_learner.runner import JobRunner
from scalerl.models import build_tiny_model
from scalerl_weight_broadcast.service import WeightBroadcastService, add_to_server
from scalerl.weights.grpc import GrpcStreamTransport
from scalerl_replay_buffer.testing import redis_url, start_buffer_server  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", sft_steps=5)


@pytest.fixture(scope="module")
def buffer_addr(redis_url):
    client = redis.Redis.from_url(redis_url)
    server = start_buffer_server(client)
    yield f"127.0.0.1:{server.grpc_port}"
    server.stop(0)
    client.close()


class Broadcast:
    """The weight-broadcast hub as its main builds it: gRPC and its TCP data plane."""

    def __init__(self):
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        service = WeightBroadcastService()
        add_to_server(service, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.data = service.serve_data("127.0.0.1", 0)
        self.addr = f"127.0.0.1:{port}"

    def stop(self, grace=None):
        self.data.stop()
        return self.server.stop(grace)


def start_broadcast():
    hub = Broadcast()
    return hub, hub.addr


def runner(tmp_path, addr, model_dir, buffer_addr) -> JobRunner:
    recipe = Recipe(model={"path": str(model_dir)}, validation={"num_prompts": 4, "at_step_zero": False},
                    task={"num_validation_prompts": 4})
    settings = Settings(data_dir=tmp_path, weight_broadcast_addr=addr, replay_buffer_addr=buffer_addr,
                        forecaster_addr="127.0.0.1:1", evaluator_addr="127.0.0.1:1")
    job = common_pb2.Job(job_id="resume-job", recipe_json=recipe.model_dump_json())
    return JobRunner(settings, job, control=None, stop=threading.Event())


def test_resume_continues_above_every_published_version(tmp_path, model_dir, buffer_addr):
    server, addr = start_broadcast()
    first = runner(tmp_path, addr, model_dir, buffer_addr)
    first.load()
    assert first.version == 0
    first.step, first.version = 3, 3
    first.publish()
    first.checkpoint()  # step 3, version 3 on disk
    for v in (4, 5, 6, 7):  # published after the checkpoint, then the learner dies
        first.version = v
        first.publish()
    first.close()

    second = runner(tmp_path, addr, model_dir, buffer_addr)
    second.load()
    assert second.step == 3  # model, optimizer and step from the checkpoint
    assert second.version == 8  # above v7 that generators may already hold
    second.publisher.flush()  # load() publishes in the background
    assert GrpcStreamTransport(addr).latest_version("resume-job") == 8
    second.close()
    server.stop(0)

    # weight-broadcast restarted empty: the on-disk high-water mark still keeps versions increasing
    server, addr = start_broadcast()
    third = runner(tmp_path, addr, model_dir, buffer_addr)
    third.load()
    assert third.version == 9
    third.close()
    server.stop(0)
