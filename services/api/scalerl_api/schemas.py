"""REST request/response bodies."""

from __future__ import annotations

import json
import math
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


def finite(v: float) -> float | None:
    """JSON has no inf or nan: None stands for them."""
    return v if math.isfinite(v) else None


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
    eval_set: str = "iid"
    """`iid` (the validation split) or a downstream eval set of the recipe's validation.eval_sets."""
    eval_sets: list[str] = []
    """Every curve the job has points on."""
    points: list[CurvePoint]


class SetCorrelationOut(BaseModel):
    eval_set: str
    num_versions: int
    """Policy versions measured on both this set and iid validation."""
    spearman: float | None
    """Spearman's rho over those versions (None: too few points)."""
    interval: tuple[float, float] | None
    """Fisher-z interval at `level`."""
    enough_points: bool
    note: str


class CorrelationsOut(BaseModel):
    job_id: str
    level: float
    sets: list[SetCorrelationOut]


class PredictionOut(BaseModel):
    compute: float
    value: float
    interval: tuple[float, float]


class DecisionOut(BaseModel):
    """Scale or stop: predictions at 2x, 4x, 10x the compute spent, compute to the target, one recommendation."""

    job_id: str
    spent: float
    """Compute (device-hours) of the latest validation point: the fit's x-axis."""
    predictions: list[PredictionOut]
    """At 2x, 4x and 10x `spent`, intervals at the fit's level."""
    gain: float
    """Predicted pass-rate gain from `spent` to 10x `spent`."""
    gain_interval: tuple[float, float]
    target: float | None
    compute_to_target: float | None
    """None: no target, or the fitted curve never reaches it (see `reason`)."""
    compute_to_target_interval: tuple[float, float | None] | None
    """At the fit's level; the upper end is None when the band's lower end never reaches the target (or more of the
    bootstrap's curves than the level's upper tail never do), and so whenever `compute_to_target` is None. None: no
    target, or not even the band's upper end reaches it."""
    recommendation: str
    """`continue`, `stop` (target reached, ceiling below the target, or ceiling reached within noise) or
    `not decidable yet` (the fit is not identifiable)."""
    reason: str
    compute_to_identify: float | None
    """When not decidable: total compute at which the fit should become identifiable (None: unknown)."""
    identifiable: bool
    level: float

    @classmethod
    def of(cls, d) -> "DecisionOut":
        has_ci = d.HasField("compute_to_target_interval")
        return cls(job_id=d.job_id, spent=d.spent,
                   predictions=[PredictionOut(compute=p.compute, value=p.value, interval=(p.interval.lo, p.interval.hi))
                                for p in d.predictions],
                   gain=d.gain, gain_interval=(d.gain_interval.lo, d.gain_interval.hi),
                   target=d.target if d.target >= 0 else None,
                   compute_to_target=d.compute_to_target if d.compute_to_target >= 0 else None,
                   compute_to_target_interval=(d.compute_to_target_interval.lo,
                                               finite(d.compute_to_target_interval.hi)) if has_ci else None,
                   recommendation=d.recommendation, reason=d.reason,
                   compute_to_identify=d.compute_to_identify if d.compute_to_identify >= 0 else None,
                   identifiable=d.identifiable, level=d.level)


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
    decision: DecisionOut | None = None
    """Scale-or-stop advice at the recipe's target (None until there is a fit)."""


class ParamDiffOut(BaseModel):
    name: str
    """A, B or C_mid."""
    a: float
    b: float
    diff: float
    """b - a; for C_mid the log ratio log(b / a)."""
    interval: tuple[float, float]
    significant: bool


class BandOut(BaseModel):
    """A fitted curve and its interval band on the comparison's shared compute grid."""

    compute: list[float]
    fit: list[float]
    lower: list[float]
    upper: list[float]


class ComparedJobOut(BaseModel):
    job_id: str
    name: str
    model: str
    """The recipe's model path."""
    task: str
    params: dict[str, float]
    intervals: dict[str, tuple[float, float]]
    """At the comparison's level."""
    identifiable: bool
    warnings: list[str]
    points: list[tuple[float, float]]
    """(compute, pass rate) of every validation point."""
    band: BandOut


class CompareOut(BaseModel):
    jobs: list[ComparedJobOut]
    """a, then b; fitted A, B, C_mid with intervals on the same compute axis (device-hours)."""
    params: list[ParamDiffOut]
    verdict: str
    """`ceiling mover`, `efficiency shaper`, `both` or `no difference beyond noise`, at `level`."""
    higher_ceiling: str | None
    """Job id with the higher ceiling beyond noise."""
    more_efficient: str | None
    """Job id that reaches its gain with less compute beyond noise."""
    level: float
    ceiling_p: float | None
    efficiency_p: float | None
    summary: str
    notes: list[str]
    warnings: list[str]
    """E.g. the jobs train different models or tasks: the comparison is shown, with this warning."""


class ErrorOut(BaseModel):
    detail: str | list


BAD_BODY = {400: {"model": ErrorOut, "description": "The body is not valid JSON"}}
UNAUTHORIZED = {401: {"model": ErrorOut, "description": "Missing or invalid bearer token"}}
NOT_FOUND = {404: {"model": ErrorOut, "description": "Unknown job"}}
NO_FIT = {409: {"model": ErrorOut, "description": "The job has no fit yet (too few validation points)"}}
BAD_QUERY = {422: {"model": ErrorOut, "description": "A query parameter is invalid (the detail names it)"}}
CONFLICT = {409: {"model": ErrorOut, "description": "The job already ended"}}
UNAVAILABLE = {503: {"model": ErrorOut, "description": "A backend service is unreachable"}}


class ScaleRequest(BaseModel):
    replicas: int = Field(ge=0)


class ScaleOut(BaseModel):
    deployment: str
    replicas: int
