"""What the services drive over the ControlPlane: which job is active, its progress, its end.

Knows nothing of gRPC: bad requests raise `scalerl.errors` classes, which the server's interceptor maps."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.orm import sessionmaker

from scalerl import errors
from scalerl.logs import job_logger
from scalerl_api import crud, metrics
from scalerl_api.backends import Backends
from scalerl_api.models import Job, JobState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActiveJob:
    """The running job as the services see it."""

    job_id: str
    recipe_json: str
    state: str


@dataclass(frozen=True)
class Progress:
    """One progress report of a job's learner."""

    step: int
    policy_version: int
    learner_device_hours: float
    generator_device_hours: float
    evaluator_device_hours: float
    generated_tokens: int
    last_pass_rate: float | None
    """None: no validation yet."""


class JobLifecycle:
    def __init__(self, sessions: sessionmaker, backends: Backends):
        self.sessions = sessions
        self.backends = backends

    def active_job(self) -> ActiveJob | None:
        with self.sessions() as db:
            job = crud.running_job(db)
            return None if job is None else ActiveJob(job.id, job.recipe_json, job.state)

    def report_progress(self, job_id: str, progress: Progress) -> bool:
        """Record the progress -> whether the job should keep running (False once cancelled or finished)."""
        with self.sessions() as db:
            job = _job(db, job_id)
            if job.state != JobState.running.value:
                return False
            crud.update_progress(db, job, step=progress.step, policy_version=progress.policy_version,
                                 learner_dh=progress.learner_device_hours,
                                 generator_dh=progress.generator_device_hours,
                                 evaluator_dh=progress.evaluator_device_hours,
                                 generated_tokens=progress.generated_tokens, last_pass_rate=progress.last_pass_rate)
            metrics.JOB_COMPUTE.labels(job_id).set(job.compute_device_hours)
            metrics.JOB_EVALUATOR_COMPUTE.labels(job_id).set(job.evaluator_device_hours)
            return True

    def finish(self, job_id: str, state: str, reason: str) -> None:
        """End the job in a final `state`. A succeeded job's replay-buffer state is freed; a failed job keeps it
        (groups, leases, accounting) until the job is deleted, for a post-mortem or a resume."""
        try:
            final = JobState(state)
        except ValueError:
            raise errors.InvalidArgument(f"{state!r} is not a job state", field="state", job_id=job_id) from None
        with self.sessions() as db:
            crud.finish_job(db, _job(db, job_id), final, reason)
        job_log = job_logger(log, job_id)
        if final is JobState.failed:
            job_log.error("failed: %s", reason)  # the whole reason (a traceback too); the job shows one line
        else:
            job_log.info("finished %s: %s", final.value, reason)
        if final is not JobState.failed:
            self.backends.cleanup_job(job_id)


def _job(db, job_id: str) -> Job:
    if not job_id:
        raise errors.InvalidArgument("is required", field="job_id")
    job = crud.get_job(db, job_id)
    if job is None:
        raise errors.NotFound("no such job", field="job_id", job_id=job_id)
    return job
