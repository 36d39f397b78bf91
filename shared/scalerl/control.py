"""Client side of the api's ControlPlane: services pull the active job instead of having it pushed."""

from __future__ import annotations

import logging
import threading

import grpc

from scalerl import errors
from scalerl.serving import channel
from scalerl.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc

log = logging.getLogger(__name__)


class ControlPlaneUnavailable(errors.Unavailable):
    """The control plane did not answer: nothing is known about the active job (keep what runs, ask again)."""


class ControlPlaneClient:
    def __init__(self, addr: str, requester: str):
        self._channel = channel(addr)
        self._stub = control_plane_pb2_grpc.ControlPlaneStub(self._channel)
        self.requester = requester

    def active_job(self, timeout: float = 5.0) -> common_pb2.Job | None:
        """The running job, or None when the control plane says no job runs.

        Raises ControlPlaneUnavailable when it did not answer: "unreachable" is not "no job" (a replica that
        read it as "no job" would stop the job it is serving whenever the api restarts)."""
        try:
            resp = self._stub.GetActiveJob(control_plane_pb2.GetActiveJobRequest(requester=self.requester),
                                           timeout=timeout)
        except grpc.RpcError as err:
            raise ControlPlaneUnavailable(f"control plane unreachable: {err.code().name}") from err
        return resp.job if resp.HasField("job") else None

    def still_active(self, job_id: str, timeout: float = 5.0) -> bool:
        """False only when the control plane answers that `job_id` is not the active job; True while it is,
        and while the control plane is unreachable (the job keeps running until it is known to have ended)."""
        try:
            job = self.active_job(timeout)
        except ControlPlaneUnavailable as err:
            log.warning("%s; keeping job %s", err, job_id)
            return True
        return job is not None and job.job_id == job_id

    def wait_for_job(self, stop: threading.Event, poll_s: float) -> common_pb2.Job | None:
        """The active job once there is one (None when `stop` is set); an unreachable control plane is
        asked again."""
        while not stop.is_set():
            try:
                job = self.active_job()
            except ControlPlaneUnavailable as err:
                log.warning("%s", err)
                job = None
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
