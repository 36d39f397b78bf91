"""The learner through the outages of the chaos test (issue 14), against real gRPC servers: the control plane
away longer than one call's deadline, a learner restarted with validations still queued, a weight-broadcast that
restarted empty, an evaluator that released a pinned version and died. Real weight-broadcast, forecaster and
replay-buffer (Valkey); the control plane and the evaluator are small servicers (the evaluator needs vLLM) that
answer as the real ones do."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest
import redis

from scalerl.control import ControlPlaneClient
from scalerl.models import build_tiny_model
from scalerl.ports import unused_port
from scalerl.recipe import Recipe
from scalerl.serving import GRPC_OPTIONS, ErrorInterceptor
from scalerl.settings import Settings
from scalerl.v1 import (common_pb2, control_plane_pb2, control_plane_pb2_grpc, forecaster_pb2, forecaster_pb2_grpc,
                        generator_pb2, generator_pb2_grpc)
from scalerl.weights.grpc import GrpcStreamTransport
from scalerl_forecaster.jobs import Forecasts
from scalerl_forecaster.service import add_to_server as add_forecaster
from scalerl_learner.runner import JobRunner
from scalerl_replay_buffer.store import BufferStore
from scalerl_replay_buffer.testing import redis_url, start_buffer_server  # noqa: F401  (fixture)
from scalerl_weight_broadcast.service import WeightBroadcastService
from scalerl_weight_broadcast.service import add_to_server as add_broadcast


class Server:
    """A gRPC server on a fixed port that can be stopped and started again (a restarted process)."""

    def __init__(self, add, on_stop=None):
        self.add, self.port, self.server = add, unused_port(), None
        self.on_stop = on_stop
        self.addr = f"127.0.0.1:{self.port}"

    def start(self) -> "Server":
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=GRPC_OPTIONS,
                                  interceptors=[ErrorInterceptor()])
        self.add(self.server)
        self.server.add_insecure_port(self.addr)
        self.server.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait()
            self.server = None
            if self.on_stop is not None:
                self.on_stop()


class Hub:
    """Adds the weight-broadcast hub as its main builds it: the gRPC service and its TCP data plane (stopped with
    the server: a restarted hub holds nothing)."""

    def __init__(self):
        self.data = None

    def add(self, server) -> None:
        service = WeightBroadcastService()
        add_broadcast(service, server)
        self.data = service.serve_data("127.0.0.1", 0)

    def stop(self) -> None:
        if self.data is not None:
            self.data.stop()
            self.data = None


class ControlPlane(control_plane_pb2_grpc.ControlPlaneServicer):
    def __init__(self):
        self.finished: list[tuple[str, str, str]] = []
        self.reports: list[int] = []

    def ReportProgress(self, request, context):
        self.reports.append(request.step)
        return control_plane_pb2.ReportProgressResponse(keep_running=True)

    def FinishJob(self, request, context):
        self.finished.append((request.job_id, request.state, request.reason))
        return control_plane_pb2.FinishJobResponse()


class Evaluator(generator_pb2_grpc.GeneratorServicer):
    """Fetches the pinned version with release as the real evaluator does (a fetch that fails is INTERNAL, as
    there); while `loading` it answers UNAVAILABLE as the real one does until its engine serves the job;
    `fail_next` calls take the version, then die before answering (UNAVAILABLE, as a killed evaluator's call)."""

    def __init__(self, weights_addr: str):
        self.weights = GrpcStreamTransport(weights_addr, timeout_s=10)
        self.loading = False
        self.fail_next = 0
        self.evaluated: list[int] = []

    def Evaluate(self, request, context):
        if self.loading:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"not serving job {request.job_id!r} yet")
        received = self.weights.fetch(request.job_id, request.policy_version, release=True)
        received.verify()
        if self.fail_next:
            self.fail_next -= 1
            context.abort(grpc.StatusCode.UNAVAILABLE, "evaluator died")
        self.evaluated.append(request.policy_version)
        return generator_pb2.EvaluateResponse(job_id=request.job_id, policy_version=request.policy_version,
                                              pass_rate=0.5, num_prompts=request.num_prompts,
                                              samples_per_prompt=request.samples_per_prompt, device_seconds=0.1,
                                              completions_graded=request.num_prompts)


class Stack:
    def __init__(self, redis_url: str, tmp_path):
        self.redis = redis.Redis.from_url(redis_url)
        self.buffer = start_buffer_server(self.redis)
        self.store = BufferStore(self.redis)
        hub = Hub()
        self.broadcast = Server(hub.add, on_stop=hub.stop).start()
        self.forecasts = Forecasts()
        self.forecaster = Server(lambda s: add_forecaster(s, self.forecasts)).start()
        self.control = ControlPlane()
        self.control_plane = Server(
            lambda s: control_plane_pb2_grpc.add_ControlPlaneServicer_to_server(self.control, s)).start()
        self.evaluator = Evaluator(self.broadcast.addr)
        self.evaluator_server = Server(
            lambda s: generator_pb2_grpc.add_GeneratorServicer_to_server(self.evaluator, s)).start()
        self.tmp_path = tmp_path

    def runner(self, job_id: str, recipe: Recipe) -> JobRunner:
        settings = Settings(data_dir=self.tmp_path, replay_buffer_addr=f"127.0.0.1:{self.buffer.grpc_port}",
                            forecaster_addr=self.forecaster.addr, evaluator_addr=self.evaluator_server.addr,
                            weight_broadcast_addr=self.broadcast.addr)
        control = ControlPlaneClient(self.control_plane.addr, "learner")
        return JobRunner(settings, common_pb2.Job(job_id=job_id, recipe_json=recipe.model_dump_json()),
                         control=control, stop=threading.Event())

    def curve(self, job_id: str) -> list[tuple[int, int]]:
        stub = forecaster_pb2_grpc.ForecasterStub(grpc.insecure_channel(self.forecaster.addr))
        points = stub.GetCurve(forecaster_pb2.GetCurveRequest(job_id=job_id), timeout=10).points
        return sorted((p.step, p.policy_version) for p in points)

    def close(self) -> None:
        for server in (self.broadcast, self.forecaster, self.control_plane, self.evaluator_server):
            server.stop()
        self.buffer.stop(0)
        self.redis.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", sft_steps=5)


@pytest.fixture
def stack(redis_url, tmp_path):
    s = Stack(redis_url, tmp_path)
    yield s
    s.close()


def recipe(model_dir, max_steps: int = 10) -> Recipe:
    return Recipe(model={"path": str(model_dir)}, task={"num_validation_prompts": 4},
                  validation={"num_prompts": 4, "at_step_zero": False, "every_steps": 5},
                  budget={"max_steps": max_steps, "checkpoint_every_steps": 5})


def test_finishing_waits_for_a_control_plane_away_longer_than_one_call():
    """The api away for 12 s (the chaos test keeps it away 30 s): FinishJob is retried until it answers,
    instead of failing after one 10 s call."""
    control = ControlPlane()
    server = Server(lambda s: control_plane_pb2_grpc.add_ControlPlaneServicer_to_server(control, s))
    client = ControlPlaneClient(server.addr, "learner")
    threading.Timer(12.0, server.start).start()
    try:
        started = time.monotonic()
        client.finish("job-1", "succeeded", "budget reached at step 10")
        assert time.monotonic() - started >= 11
        assert control.finished == [("job-1", "succeeded", "budget reached at step 10")]
        assert client.report(control_plane_pb2.JobProgress(job_id="job-1", step=10)) is True
        assert control.reports == [10]
    finally:
        time.sleep(0.1)
        server.stop()
        client.close()


def test_a_restarted_learner_validates_what_was_queued_and_does_not_train_past_its_budget(stack, model_dir):
    """The learner reached its budget, queued the last validation and died before it ran (the evaluator was
    restarting); weight-broadcast restarted too and forgot the pinned version. The restarted learner publishes
    no new version, trains no step, validates the queued version once (re-publishing it) and finishes."""
    job_id = "outage-budget"
    r = recipe(model_dir)
    stack.store.init_job(job_id, r)
    first = stack.runner(job_id, r)
    first.load()
    for step in range(1, 11):  # as run() does, without the batches: publish, validate every 5 steps
        first.step, first.version = step, first.version + 1
        first.publish(pinned=step % 5 == 0)
        if step % 5 == 0:
            stack.evaluator.loading = step == 10  # the evaluator restarts: the last validation cannot run yet
            first.validate(first.version, step)
            if step == 5:
                first.pending_validations[-1].result(timeout=60)
    first.checkpoint()  # step 10 = the budget
    first.close()  # the learner dies with the step-10 validation queued
    first.pending_validations[-1].result(timeout=60)
    assert stack.curve(job_id) == [(5, 5)]

    stack.broadcast.stop()
    stack.broadcast.start()  # restarted empty, on the same address
    stack.evaluator.loading = False

    second = stack.runner(job_id, r)
    second.run()
    second.close()
    assert second.step == 10 and second.version == 10  # no step trained, no version published
    assert GrpcStreamTransport(stack.broadcast.addr).latest_version(job_id) == 10  # v10 re-published, no v11
    assert stack.curve(job_id) == [(5, 5), (10, 10)]  # each validation exactly once
    assert stack.evaluator.evaluated == [5, 10]
    assert stack.control.finished == [(job_id, "succeeded", "budget reached at step 10")]


def test_a_version_the_evaluator_released_and_lost_is_published_again(stack, model_dir):
    """The evaluator fetched the pinned version (which releases it) and died; the retry finds it gone
    ("job has no version ..."), so the learner publishes it again, pinned, and the point lands once."""
    job_id = "outage-released"
    r = recipe(model_dir)
    stack.store.init_job(job_id, r)
    runner = stack.runner(job_id, r)
    runner.load()
    for step in range(1, 6):
        runner.step, runner.version = step, runner.version + 1
        runner.publish(pinned=step == 5)
    for _ in range(5):  # v5 falls out of the kept versions: only its pin held it
        runner.version += 1
        runner.publish()
    stack.evaluator.fail_next = 1
    runner.validate(5, 5)
    runner.pending_validations[-1].result(timeout=120)
    runner.close()
    assert stack.evaluator.evaluated == [5]
    assert stack.curve(job_id) == [(5, 5)]


def test_a_send_that_outlives_its_job_leaves_no_metric_series_behind(stack, model_dir, monkeypatch):
    """The job is closed (cancelled) while its last version waits for a restarting hub; the service forgets the
    job's series. The send goes through later: it must not bring them back (they would stay, stale, for good)."""
    from prometheus_client import REGISTRY

    from scalerl_learner import metrics, runner as runner_module

    monkeypatch.setattr(runner_module, "PUBLISH_CLOSE_TIMEOUT_S", 0.5)
    job_id = "outage-late-send"
    r = recipe(model_dir)
    stack.store.init_job(job_id, r)
    runner = stack.runner(job_id, r)
    runner.load()
    assert runner.publisher.flush(timeout=60)
    assert REGISTRY.get_sample_value("scalerl_learner_policy_version", {"job_id": job_id}) == runner.version
    stack.broadcast.stop()
    runner.step, runner.version = 1, runner.version + 1
    runner.publish()  # in flight until the hub is back
    runner.close()
    metrics.forget_job(job_id)
    stack.broadcast.start()
    deadline = time.monotonic() + 60
    while runner.publisher.sent_version < runner.version and time.monotonic() < deadline:
        time.sleep(0.1)
    assert runner.publisher.sent_version == runner.version
    assert REGISTRY.get_sample_value("scalerl_learner_policy_version", {"job_id": job_id}) is None
    assert REGISTRY.get_sample_value("scalerl_learner_weights_publish_duration_seconds_count",
                                     {"job_id": job_id, "sent_as": "whole"}) is None
    runner.weights.close()
