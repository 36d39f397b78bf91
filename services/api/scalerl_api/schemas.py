"""REST request/response bodies."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from pydantic import BaseModel, ConfigDict, Field

from scalerl.recipe import Recipe
from scalerl_api.models import Job


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    recipe: Recipe = Field(default_factory=Recipe)
    name: str | None = Field(default=None, max_length=200)


class ComputeOut(BaseModel):
    total_device_hours: float
    """Learner + rollout generators: the forecast's x-axis and the compute budget (the evaluator apart)."""
    learner_device_hours: float
    generator_device_hours: float
    """Rollout generators only."""
    evaluator_device_hours: float
    """Validation: not in the total."""
    generated_tokens: int


def _utc(moment: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; the store writes UTC, so say so (RFC 3339 needs the offset)."""
    if moment is not None and moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment


class JobOut(BaseModel):
    id: str
    name: str
    state: str
    reason: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    step: int
    policy_version: int
    compute: ComputeOut
    last_pass_rate: float | None
    recipe: dict

    @classmethod
    def of(cls, job: Job) -> "JobOut":
        return cls(
            id=job.id, name=job.name, state=job.state, reason=job.reason, created_at=_utc(job.created_at),
            started_at=_utc(job.started_at), finished_at=_utc(job.finished_at), step=job.step,
            policy_version=job.policy_version, last_pass_rate=job.last_pass_rate,
            recipe=json.loads(job.recipe_json),
            compute=ComputeOut(total_device_hours=job.learner_device_hours + job.generator_device_hours,
                               learner_device_hours=job.learner_device_hours,
                               generator_device_hours=job.generator_device_hours,
                               evaluator_device_hours=job.evaluator_device_hours,
                               generated_tokens=job.generated_tokens),
        )


class JobList(BaseModel):
    jobs: list[JobOut]
    count: int


class CurvePoint(BaseModel):
    step: int
    policy_version: int
    compute: float
    """Device-hours (learner + generators) spent when this version was published: the forecast's x-axis."""
    value: float
    """Validation pass rate (mean@k) of exactly this version."""
    learner_device_hours: float
    generator_device_hours: float
    generated_tokens: int


class CurveOut(BaseModel):
    job_id: str
    points: list[CurvePoint]


class PredictionOut(BaseModel):
    compute: float
    value: float
    interval: tuple[float, float]


class ForecastOut(BaseModel):
    job_id: str
    model: str
    params: dict[str, float]
    intervals: dict[str, tuple[float, float]]
    predictions: list[PredictionOut]
    identifiable: bool
    warnings: list[str]
    num_points: int
    compute_to_target: float | None


class ErrorOut(BaseModel):
    detail: str | list


BAD_BODY = {400: {"model": ErrorOut, "description": "The body is not valid JSON"}}
UNAUTHORIZED = {401: {"model": ErrorOut, "description": "Missing or invalid bearer token"}}
NOT_FOUND = {404: {"model": ErrorOut, "description": "Unknown job"}}
CONFLICT = {409: {"model": ErrorOut, "description": "The job already ended"}}
UNAVAILABLE = {503: {"model": ErrorOut, "description": "A backend service is unreachable"}}


class ScaleRequest(BaseModel):
    replicas: int = Field(ge=0)


class ScaleOut(BaseModel):
    deployment: str
    replicas: int
