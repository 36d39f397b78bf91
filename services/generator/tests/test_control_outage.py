"""An unreachable control plane is not "no active job" (issue 14 e): against a real gRPC ControlPlane server
that is stopped for a while, the generator's job watch keeps the job, and the client tells the two apart."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent import futures

import grpc
import pytest

from scalerl.control import ControlPlaneClient, ControlPlaneUnavailable
from scalerl.ports import unused_port
from scalerl.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc
from scalerl_generator.jobs import watch_job


class ControlPlane(control_plane_pb2_grpc.ControlPlaneServicer):
    def __init__(self):
        self.job: common_pb2.Job | None = None

    def GetActiveJob(self, request, context):
        return control_plane_pb2.ActiveJob(job=self.job) if self.job else control_plane_pb2.ActiveJob()


class Server:
    """A ControlPlane server on a fixed port that can be stopped and started again."""

    def __init__(self):
        self.port = unused_port()
        self.servicer = ControlPlane()
        self.server = None

    def start(self) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        control_plane_pb2_grpc.add_ControlPlaneServicer_to_server(self.servicer, self.server)
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait()


@pytest.fixture
def control_plane():
    server = Server()
    server.servicer.job = common_pb2.Job(job_id="job-1", recipe_json="{}")
    server.start()
    yield server
    server.stop()


def test_unreachable_is_not_no_job(control_plane):
    client = ControlPlaneClient(f"127.0.0.1:{control_plane.port}", "gen-test")
    assert client.active_job().job_id == "job-1"
    control_plane.stop()
    with pytest.raises(ControlPlaneUnavailable):
        client.active_job(timeout=1)
    assert client.still_active("job-1", timeout=1)
    control_plane.servicer.job = None
    control_plane.start()
    assert client.active_job() is None
    assert not client.still_active("job-1")
    client.close()


def test_wait_for_job_outlasts_an_outage(control_plane):
    client = ControlPlaneClient(f"127.0.0.1:{control_plane.port}", "gen-test")
    control_plane.stop()
    threading.Timer(1.0, control_plane.start).start()
    job = client.wait_for_job(threading.Event(), 0.1)
    assert job is not None and job.job_id == "job-1"
    client.close()


def test_generator_keeps_its_job_while_the_control_plane_is_down(control_plane):
    client = ControlPlaneClient(f"127.0.0.1:{control_plane.port}", "gen-test")
    pool = futures.ThreadPoolExecutor(max_workers=1)
    watcher = pool.submit(asyncio.run, watch_job(client, "job-1", 0.1, threading.Event(), lambda: True,
                                                 rpc_timeout_s=0.5))
    time.sleep(0.5)
    control_plane.stop()
    time.sleep(2.5)  # polls time out meanwhile (each call waits 0.5 s for the server)
    assert not watcher.done(), "the generator stopped its job because the control plane was unreachable"
    control_plane.start()
    time.sleep(0.5)
    assert not watcher.done()
    control_plane.servicer.job = None  # the job ended: now the watch returns
    deadline = time.monotonic() + 30
    while not watcher.done() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert watcher.done() and watcher.exception() is None
    pool.shutdown()
    client.close()
