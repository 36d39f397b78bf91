"""The job store's tables (SQLAlchemy 2 typed models). Schema changes go through Alembic migrations."""

from __future__ import annotations

import enum
from datetime import datetime, timezone

from sqlalchemy import DateTime, Float, Index, Integer, String, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class JobState(str, enum.Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.succeeded, JobState.failed, JobState.cancelled)


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        # at most one running job per deployment, whatever number of schedulers race (migration 0002)
        Index("uq_jobs_one_running", "state", unique=True, sqlite_where=text("state = 'running'"),
              postgresql_where=text("state = 'running'")),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16), index=True, default=JobState.queued.value)
    recipe_json: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    step: Mapped[int] = mapped_column(Integer, default=0)
    policy_version: Mapped[int] = mapped_column(Integer, default=0)
    compute_device_hours: Mapped[float] = mapped_column(Float, default=0.0)
    learner_device_hours: Mapped[float] = mapped_column(Float, default=0.0)
    generator_device_hours: Mapped[float] = mapped_column(Float, default=0.0)
    evaluator_device_hours: Mapped[float] = mapped_column(Float, default=0.0)
    generated_tokens: Mapped[int] = mapped_column(Integer, default=0)
    last_pass_rate: Mapped[float | None] = mapped_column(Float, nullable=True)
