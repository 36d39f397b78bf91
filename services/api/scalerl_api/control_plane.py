"""The ControlPlane gRPC servicer and the scheduler that starts queued jobs one at a time."""

from __future__ import annotations

import logging
import threading

import grpc
from prometheus_client import Gauge
from sqlalchemy.orm import sessionmaker

from scalerl_api import crud
from scalerl_api.backends import Backends
from scalerl_api.models import JobState
from scalerl.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc

log = logging.getLogger(__name__)

JOBS = Gauge("scalerl_api_jobs", "Jobs in the store by state", ["state"])


class ControlPlaneService(control_plane_pb2_grpc.ControlPlaneServicer):
    def __init__(self, sessions: sessionmaker, backends: Backends):
        self.sessions = sessions
        self.backends = backends

    def GetActiveJob(self, request, context):
        with self.sessions() as db:
            job = crud.running_job(db)
            if job is None:
                return control_plane_pb2.ActiveJob()
            return control_plane_pb2.ActiveJob(job=common_pb2.Job(job_id=job.id, recipe_json=job.recipe_json,
                                                                  state=job.state))

    def ReportProgress(self, request, context):
        if not request.job_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job_id is required")
        with self.sessions() as db:
            job = crud.get_job(db, request.job_id)
            if job is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"job_id: job {request.job_id} not found")
            if job.state != JobState.running.value:
                return control_plane_pb2.ReportProgressResponse(keep_running=False)
            c = request.compute
            crud.update_progress(db, job, step=request.step, policy_version=request.policy_version,
                                 learner_dh=c.learner_device_hours, generator_dh=c.generator_device_hours,
                                 evaluator_dh=c.evaluator_device_hours, generated_tokens=c.generated_tokens,
                                 last_pass_rate=request.last_pass_rate if request.last_pass_rate >= 0 else None)
            return control_plane_pb2.ReportProgressResponse(keep_running=True)

    def FinishJob(self, request, context):
        try:
            state = JobState(request.state)
        except ValueError:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"state: {request.state!r} is not a job state")
        with self.sessions() as db:
            job = crud.get_job(db, request.job_id)
            if job is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"job_id: job {request.job_id} not found")
            try:
                crud.finish_job(db, job, state, request.reason)
            except crud.InvalidTransition as err:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        log.info("job %s %s %s", request.job_id, state.value, request.reason)
        self.backends.cleanup_job(request.job_id)
        return control_plane_pb2.FinishJobResponse()


class Scheduler:
    """Starts the oldest queued job when none runs; prepares its prompt pool; fails it if that fails."""

    def __init__(self, sessions: sessionmaker, backends: Backends, interval_s: float = 1.0):
        self.sessions, self.backends, self.interval_s = sessions, backends, interval_s

    def tick(self) -> None:
        with self.sessions() as db:
            for state, n in crud.count_by_state(db).items():
                JOBS.labels(state).set(n)
            job = crud.next_job_to_start(db)
            if job is None:
                return
            try:
                # The prompt pool first: services start on a running job at once and must find it ready.
                pool = self.backends.init_job(job.id, job.recipe_json)
                if crud.mark_running(db, job) is None:
                    log.info("job %s left the queue while its prompt pool was prepared", job.id)
                    return
                log.info("job %s running (prompt pool %d)", job.id, pool)
            except grpc.RpcError as err:
                crud.finish_job(db, job, JobState.failed, f"replay-buffer could not prepare the job: {err.details()}")
                log.error("job %s failed to start: %s", job.id, err.details())

    def run_until(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("scheduler tick failed")
            stop.wait(self.interval_s)
