from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from scalerl_api import crud, metrics
from scalerl_api.api.deps import BackendsDep, SessionDep
from scalerl_api.models import Job, JobState
from scalerl_api.schemas import (BAD_BODY, CONFLICT, NOT_FOUND, UNAVAILABLE, CurveOut, CurvePoint, ForecastOut, JobCreate,
                                 JobList, JobOut, PredictionOut)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def _job_or_404(db, job_id: str) -> Job:
    job = crud.get_job(db, job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id} not found")
    return job


@router.post("", status_code=status.HTTP_201_CREATED, response_model=JobOut, responses=BAD_BODY)
def submit_job(body: JobCreate, db: SessionDep) -> JobOut:
    return JobOut.of(crud.create_job(db, body.recipe, body.name))


@router.get("", response_model=JobList)
def list_jobs(db: SessionDep, state: JobState | None = None, limit: int = 100, offset: int = 0) -> JobList:
    jobs = crud.list_jobs(db, state, min(max(limit, 1), 1000), max(offset, 0))
    return JobList(jobs=[JobOut.of(j) for j in jobs], count=len(jobs))


@router.get("/{job_id}", response_model=JobOut, responses=NOT_FOUND)
def get_job(job_id: str, db: SessionDep) -> JobOut:
    return JobOut.of(_job_or_404(db, job_id))


@router.post("/{job_id}/cancel", response_model=JobOut, responses=NOT_FOUND | CONFLICT)
def cancel_job(job_id: str, db: SessionDep, backends: BackendsDep) -> JobOut:
    job = _job_or_404(db, job_id)
    try:
        crud.finish_job(db, job, JobState.cancelled, "cancelled by user")
    except crud.InvalidTransition as err:
        raise HTTPException(status.HTTP_409_CONFLICT, str(err)) from err
    backends.cleanup_job(job_id)
    return JobOut.of(job)


@router.delete("/{job_id}", status_code=status.HTTP_204_NO_CONTENT, responses=NOT_FOUND | CONFLICT)
def delete_job(job_id: str, db: SessionDep, backends: BackendsDep) -> None:
    """Forget an ended job and free what the replay buffer still keeps of it (a failed job keeps its groups and
    accounting until then); a queued or running job must be cancelled first."""
    job = _job_or_404(db, job_id)
    try:
        crud.delete_job(db, job)
    except crud.InvalidTransition as err:
        raise HTTPException(status.HTTP_409_CONFLICT, str(err)) from err
    backends.cleanup_job(job_id)
    metrics.forget_job(job_id)


@router.get("/{job_id}/curve", response_model=CurveOut, responses=NOT_FOUND | UNAVAILABLE)
def get_curve(job_id: str, db: SessionDep, backends: BackendsDep) -> CurveOut:
    _job_or_404(db, job_id)
    curve = backends.curve(job_id)  # BackendUnavailable → 503 (handler in main)
    return CurveOut(job_id=job_id, points=[
        CurvePoint(step=p.step, policy_version=p.policy_version, compute=p.compute, value=p.value,
                   learner_device_hours=p.split.learner_device_hours,
                   generator_device_hours=p.split.generator_device_hours, generated_tokens=p.split.generated_tokens)
        for p in curve.points])


@router.get("/{job_id}/forecast", response_model=ForecastOut, responses=NOT_FOUND | UNAVAILABLE)
def get_forecast(job_id: str, db: SessionDep, backends: BackendsDep) -> ForecastOut:
    _job_or_404(db, job_id)
    f = backends.forecast(job_id)
    params = {"A": f.a, "B": f.b, "C_mid": f.c_mid, "R0": f.r0} if f.model else {}
    return ForecastOut(
        job_id=job_id, model=f.model, params=params,
        intervals={k: (v.lo, v.hi) for k, v in f.intervals.items()},
        predictions=[PredictionOut(compute=p.compute, value=p.value, interval=(p.interval.lo, p.interval.hi))
                     for p in f.predictions],
        identifiable=f.identifiable, warnings=list(f.warnings), num_points=f.num_points,
        compute_to_target=f.compute_to_target if f.compute_to_target >= 0 else None)
