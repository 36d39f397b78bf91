from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from scalerl_api import crud, metrics
from scalerl_api.api.deps import BackendsDep, SessionDep
from scalerl_api.models import Job, JobState
from scalerl_api.backends import NoFit, Refused
from scalerl_api.schemas import (BAD_BODY, BAD_QUERY, CONFLICT, NO_FIT, NOT_FOUND, UNAVAILABLE, BandOut, CompareOut,
                                 ComparedJobOut, CorrelationsOut, CurveOut, CurvePoint, DecisionOut, ForecastOut, JobCreate, JobList,
                                 JobOut, ParamDiffOut, PredictionOut, SetCorrelationOut, finite)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
compare_router = APIRouter(prefix="/v1/compare", tags=["decisions"])


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


EvalSetQuery = Annotated[str, Query(alias="set", max_length=64, pattern=r"^[A-Za-z0-9_.\-/]*$",
                                    description="`iid` (default) or a downstream eval set of the recipe")]


def _refused(err: Refused) -> HTTPException:
    return HTTPException(422, str(err))


@router.get("/{job_id}/curve", response_model=CurveOut, responses=NOT_FOUND | BAD_QUERY | UNAVAILABLE)
def get_curve(job_id: str, db: SessionDep, backends: BackendsDep, eval_set: EvalSetQuery = "iid") -> CurveOut:
    _job_or_404(db, job_id)
    try:
        curve = backends.curve(job_id, "" if eval_set == "iid" else eval_set)  # unavailable → 503 (main)
    except Refused as err:
        raise _refused(err) from err
    if eval_set != "iid" and eval_set not in curve.eval_sets:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"set: job {job_id} has no points for eval set {eval_set!r} "
                                                       f"(it has: {', '.join(curve.eval_sets) or 'none yet'})")
    return CurveOut(job_id=job_id, eval_set=eval_set, eval_sets=list(curve.eval_sets), points=[
        CurvePoint(step=p.step, policy_version=p.policy_version, compute=p.compute, value=p.value,
                   learner_device_hours=p.split.learner_device_hours,
                   generator_device_hours=p.split.generator_device_hours, generated_tokens=p.split.generated_tokens)
        for p in curve.points])


@router.get("/{job_id}/forecast", response_model=ForecastOut, responses=NOT_FOUND | BAD_QUERY | UNAVAILABLE)
def get_forecast(job_id: str, db: SessionDep, backends: BackendsDep, eval_set: EvalSetQuery = "iid") -> ForecastOut:
    _job_or_404(db, job_id)
    try:
        f = backends.forecast(job_id, "" if eval_set == "iid" else eval_set)
    except Refused as err:
        raise _refused(err) from err
    params = {"A": f.a, "B": f.b, "C_mid": f.c_mid, "R0": f.r0} if f.model else {}
    return ForecastOut(
        job_id=job_id, model=f.model, params=params,
        intervals={k: (v.lo, v.hi) for k, v in f.intervals.items()},
        predictions=[PredictionOut(compute=p.compute, value=p.value, interval=(p.interval.lo, p.interval.hi))
                     for p in f.predictions],
        identifiable=f.identifiable, warnings=list(f.warnings), num_points=f.num_points,
        compute_to_target=f.compute_to_target if f.compute_to_target >= 0 else None,
        decision=DecisionOut.of(f.decision) if f.HasField("decision") else None)


@router.get("/{job_id}/decision", response_model=DecisionOut, tags=["decisions"],
            responses=NOT_FOUND | NO_FIT | BAD_QUERY | UNAVAILABLE)
def get_decision(job_id: str, db: SessionDep, backends: BackendsDep,
                 target: Annotated[float | None, Query(gt=0, le=1, description="Pass rate to reach (default: the "
                                                                                "recipe's target)")] = None
                 ) -> DecisionOut:
    """Scale or stop, for a running or finished job: the pass rate predicted at 2x, 4x and 10x the compute spent,
    the compute to reach the target, and continue / stop / not decidable yet (with the compute the fit needs)."""
    _job_or_404(db, job_id)
    try:
        return DecisionOut.of(backends.decision(job_id, target))
    except NoFit as err:
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} has no fit yet: {err}") from err
    except Refused as err:
        raise HTTPException(422, str(err)) from err


@router.get("/{job_id}/correlations", response_model=CorrelationsOut, tags=["decisions"],
            responses=NOT_FOUND | NO_FIT | UNAVAILABLE)
def get_correlations(job_id: str, db: SessionDep, backends: BackendsDep) -> CorrelationsOut:
    """Does each downstream eval set track iid validation? Spearman's rho over the policy versions both measured,
    with an interval, or "too few points"."""
    _job_or_404(db, job_id)
    try:
        c = backends.correlations(job_id)
    except NoFit as err:
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} has no validation points yet: {err}") from err
    return CorrelationsOut(job_id=job_id, level=c.level, sets=[
        SetCorrelationOut(eval_set=s.eval_set, num_versions=s.num_versions,
                          spearman=s.spearman if s.enough_points else None,
                          interval=(s.interval.lo, s.interval.hi) if s.enough_points else None,
                          enough_points=s.enough_points, note=s.note) for s in c.sets])


@compare_router.get("", response_model=CompareOut, responses=NOT_FOUND | NO_FIT | BAD_QUERY | UNAVAILABLE)
def compare_jobs(db: SessionDep, backends: BackendsDep,
                 jobs: Annotated[str, Query(description="Two job ids, comma-separated: a,b")],
                 level: Annotated[float, Query(gt=0, lt=1, description="Level of the verdict")] = 0.95) -> CompareOut:
    """Two jobs' fitted A, B, C_mid with intervals on the same compute axis, and the verdict at `level`: ceiling
    mover (A differs), efficiency shaper (B, C_mid differ), both, or no difference beyond noise. Jobs that train
    different models or tasks are compared with a warning."""
    ids = [j.strip() for j in jobs.split(",") if j.strip()]
    if len(ids) != 2 or ids[0] == ids[1]:
        raise HTTPException(422,
                            f"jobs: give exactly two different job ids, comma-separated (got {ids})")
    rows = [_job_or_404(db, j) for j in ids]
    try:
        cmp = backends.compare(ids, level)
    except NoFit as err:
        raise HTTPException(status.HTTP_409_CONFLICT, f"cannot compare yet: {err}") from err
    except Refused as err:
        raise HTTPException(422, str(err)) from err
    out_jobs = []
    for job, row in zip(cmp.jobs, rows):
        recipe = json.loads(row.recipe_json)
        f = job.forecast
        out_jobs.append(ComparedJobOut(
            job_id=job.job_id, name=row.name, model=recipe.get("model", {}).get("path", ""),
            task=recipe.get("task", {}).get("name", ""),
            params={"A": f.a, "B": f.b, "C_mid": f.c_mid, "R0": f.r0},
            intervals={k: (v.lo, v.hi) for k, v in f.intervals.items()}, identifiable=f.identifiable,
            warnings=list(f.warnings), points=[(p.compute, p.value) for p in job.points],
            band=BandOut(compute=list(job.band.compute), fit=list(job.band.fit), lower=list(job.band.lower),
                         upper=list(job.band.upper))))
    return CompareOut(
        jobs=out_jobs,
        params=[ParamDiffOut(name=p.name, a=p.a, b=p.b, diff=p.diff, interval=(p.interval.lo, p.interval.hi),
                             significant=p.significant) for p in cmp.params],
        verdict=cmp.verdict, higher_ceiling=cmp.higher_ceiling or None, more_efficient=cmp.more_efficient or None,
        level=cmp.level, ceiling_p=finite(cmp.ceiling_p), efficiency_p=finite(cmp.efficiency_p),
        summary=cmp.summary, notes=list(cmp.notes), warnings=list(cmp.warnings))
