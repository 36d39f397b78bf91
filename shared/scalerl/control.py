"""Client side of the api's ControlPlane: services pull the active job instead of having it pushed."""

from __future__ import annotations

import logging
import threading

import grpc

from scalerl.serving import channel
from scalerl.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc

log = logging.getLogger(__name__)


class ControlPlaneClient:
    def __init__(self, addr: str, requester: str):
        self._channel = channel(addr)
        self._stub = control_plane_pb2_grpc.ControlPlaneStub(self._channel)
        self.requester = requester

    def active_job(self, timeout: float = 5.0) -> common_pb2.Job | None:
        """The running job, or None (also when the control plane is unreachable for now)."""
        try:
            resp = self._stub.GetActiveJob(control_plane_pb2.GetActiveJobRequest(requester=self.requester),
                                           timeout=timeout)
        except grpc.RpcError as err:
            log.warning("control plane unreachable: %s", err.code().name)
            return None
        return resp.job if resp.HasField("job") else None

    def wait_for_job(self, stop: threading.Event, poll_s: float) -> common_pb2.Job | None:
        while not stop.is_set():
            job = self.active_job()
            if job is not None:
                return job
            stop.wait(poll_s)
        return None

    def report(self, progress: control_plane_pb2.JobProgress) -> bool:
        """Report progress; False when the job is no longer running (cancelled or finished)."""
        try:
            return self._stub.ReportProgress(progress, timeout=10).keep_running
        except grpc.RpcError as err:
            log.warning("progress report failed: %s", err.code().name)
            return True

    def finish(self, job_id: str, state: str, reason: str = "") -> None:
        self._stub.FinishJob(control_plane_pb2.FinishJobRequest(job_id=job_id, state=state, reason=reason),
                             timeout=10)

    def close(self) -> None:
        self._channel.close()
