"""Client side of the api's ControlPlane: services pull the active job instead of having it pushed."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

import grpc

from scalerl import errors
from scalerl.serving import call_until_answered, channel
from scalerl.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc

log = logging.getLogger(__name__)

T = TypeVar("T")

# Codes that say "not answered (yet)": the api restarting, away, or too slow; anything else is its answer.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED})


class ControlPlaneUnavailable(errors.Unavailable):
    """The control plane did not answer: nothing is known about the active job (keep what runs, ask again)."""


class ControlPlaneClient:
    """`report_deadline_s` / `finish_deadline_s`: how long a progress report / the end of a job is retried while
    the control plane does not answer (each attempt `rpc_timeout_s`)."""

    def __init__(self, addr: str, requester: str, *, rpc_timeout_s: float = 10.0, report_deadline_s: float = 120.0,
                 finish_deadline_s: float = 1800.0):
        self._channel = channel(addr)
        self._stub = control_plane_pb2_grpc.ControlPlaneStub(self._channel)
        self.requester = requester
        self.rpc_timeout_s = rpc_timeout_s
        self.report_deadline_s = report_deadline_s
        self.finish_deadline_s = finish_deadline_s

    def _until_answered(self, what: str, call: Callable[[float], T], deadline_s: float) -> T:
        """`call(timeout)` again, with backoff, while the control plane does not answer; ControlPlaneUnavailable
        once `deadline_s` has passed. An answer that is an error (e.g. FAILED_PRECONDITION) is raised as is."""
        try:
            return call_until_answered(
                call, deadline_s=deadline_s, retryable=RETRYABLE,
                attempt_timeout=lambda left: max(0.1, min(self.rpc_timeout_s, left)),
                on_retry=lambda err: log.warning("%s: control plane did not answer (%s); retrying", what,
                                                 err.code().name))
        except grpc.RpcError as err:
            if err.code() not in RETRYABLE:
                raise
            raise ControlPlaneUnavailable(f"{what}: control plane unreachable for {deadline_s:.0f}s "
                                          f"({err.code().name})") from err

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
        """Report progress, retried until the control plane answers (within `report_deadline_s`); False when
        the job is no longer running (cancelled or finished). True when it never answered: the job keeps
        running until it is known to have ended."""
        try:
            return self._until_answered("progress report",
                                        lambda timeout: self._stub.ReportProgress(progress, timeout=timeout),
                                        self.report_deadline_s).keep_running
        except ControlPlaneUnavailable as err:
            log.warning("%s", err)
            return True
        except grpc.RpcError as err:
            log.warning("progress report refused: %s", err.code().name)
            return True

    def finish(self, job_id: str, state: str, reason: str = "") -> None:
        """End the job in `state`, retried until the control plane answers (within `finish_deadline_s`, then
        ControlPlaneUnavailable). A refusal is raised as the RpcError: FAILED_PRECONDITION when the job has
        ended already (a cancel, or a retried FinishJob whose first answer was lost), which the caller decides
        about."""
        request = control_plane_pb2.FinishJobRequest(job_id=job_id, state=state, reason=reason)
        self._until_answered(f"finishing job {job_id} ({state})",
                             lambda timeout: self._stub.FinishJob(request, timeout=timeout),
                             self.finish_deadline_s)

    def close(self) -> None:
        self._channel.close()


def follow_active_job(addr: str, requester: str, on_active: Callable[[str | None], None],
                      stop: threading.Event, poll_s: float) -> None:
    """Call `on_active(job_id or None)` with the control plane's active job every `poll_s` until `stop`: the
    services that keep per-job state without running jobs (series, weight versions) drop an ended job's. An
    unanswered poll is skipped: unknown is not "no job"."""
    control = ControlPlaneClient(addr, requester)
    try:
        while not stop.wait(poll_s):
            try:
                active = control.active_job()
            except ControlPlaneUnavailable:
                continue
            on_active(active.job_id if active is not None else None)
    finally:
        control.close()
