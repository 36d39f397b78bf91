"""Job store operations and the job lifecycle: queued → running → succeeded | failed | cancelled."""

from __future__ import annotations

import re
import uuid

from sqlalchemy import exists, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from scalerl import errors
from scalerl.recipe import Recipe
from scalerl_api.models import Job, JobState, utcnow


class InvalidTransition(errors.FailedPrecondition):
    """The job cannot move to the requested state (it already ended, or the state is not a final one)."""


def create_job(db: Session, recipe: Recipe, name: str | None = None) -> Job:
    job = Job(id=uuid.uuid4().hex[:16], name=name or recipe.name, state=JobState.queued.value,
              recipe_json=recipe.model_dump_json(), reason="", created_at=utcnow(), updated_at=utcnow(),
              step=0, policy_version=0, compute_device_hours=0.0, learner_device_hours=0.0,
              generator_device_hours=0.0, evaluator_device_hours=0.0, generated_tokens=0)
    db.add(job)
    db.commit()
    return job


def get_job(db: Session, job_id: str) -> Job | None:
    return db.get(Job, job_id)


def list_jobs(db: Session, state: JobState | None = None, limit: int = 100, offset: int = 0) -> list[Job]:
    query = select(Job).order_by(Job.created_at.desc()).limit(limit).offset(offset)
    if state is not None:
        query = query.where(Job.state == state.value)
    return list(db.scalars(query))


def count_by_state(db: Session) -> dict[str, int]:
    rows = db.execute(select(Job.state, func.count()).group_by(Job.state)).all()
    return {state.value: 0 for state in JobState} | {state: n for state, n in rows}


def running_job(db: Session) -> Job | None:
    return db.scalars(select(Job).where(Job.state == JobState.running.value).order_by(Job.started_at)).first()


def next_job_to_start(db: Session) -> Job | None:
    """Jobs run one at a time per deployment: the oldest queued job, if none is running."""
    if running_job(db) is not None:
        return None
    return db.scalars(select(Job).where(Job.state == JobState.queued.value).order_by(Job.created_at)).first()


def mark_running(db: Session, job: Job) -> Job | None:
    """queued → running in one conditional UPDATE -> None if the job left the queue meanwhile (cancelled while its
    pool was prepared) or another job runs (started by another api replica's scheduler). The unique partial index
    on running jobs settles two such UPDATEs that run at once (each sees no running job in its snapshot)."""
    other = aliased(Job)
    now = utcnow()
    start = (update(Job)
             .where(Job.id == job.id, Job.state == JobState.queued.value,
                    ~exists().where(other.state == JobState.running.value))
             .values(state=JobState.running.value, started_at=now, updated_at=now)
             .execution_options(synchronize_session=False))
    try:
        started = db.execute(start).rowcount == 1
        db.commit()
    except IntegrityError:
        db.rollback()
        return None
    db.refresh(job)
    return job if started else None


_DIRECTORIES = re.compile(r"(?<![\w.:/])/(?:[^\s/'\":,()]+/)+")


def one_line_reason(reason: str, limit: int = 500) -> str:
    """What a job's `reason` shows: one line, no server file paths (a traceback belongs in the log). The first
    line of `reason`, or the last one of a bare traceback (the exception), with directories cut from paths."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    line = _DIRECTORIES.sub("", line)
    return line if len(line) <= limit else line[:limit - 1] + "…"


def finish_job(db: Session, job: Job, state: JobState, reason: str = "") -> Job:
    if not state.terminal:
        raise InvalidTransition(f"{state.value} is not a final state", field="state", job_id=job.id)
    if JobState(job.state).terminal:
        raise InvalidTransition(f"job {job.id} is already {job.state}", job_id=job.id)
    job.state = state.value
    job.reason = one_line_reason(reason)
    job.finished_at = utcnow()
    db.commit()
    return job


def delete_job(db: Session, job: Job) -> None:
    if not JobState(job.state).terminal:
        raise InvalidTransition(f"job {job.id} is {job.state}: cancel it first", job_id=job.id)
    db.delete(job)
    db.commit()


def update_progress(db: Session, job: Job, *, step: int, policy_version: int, learner_dh: float,
                    generator_dh: float, evaluator_dh: float, generated_tokens: int,
                    last_pass_rate: float | None) -> Job:
    job.step = max(job.step, step)
    job.policy_version = max(job.policy_version, policy_version)
    job.learner_device_hours = learner_dh
    job.generator_device_hours = generator_dh
    job.evaluator_device_hours = evaluator_dh
    job.compute_device_hours = learner_dh + generator_dh  # the forecast's x-axis: the evaluator apart
    job.generated_tokens = generated_tokens
    if last_pass_rate is not None:
        job.last_pass_rate = last_pass_rate
    db.commit()
    return job
