"""jobs table

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("recipe_json", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("policy_version", sa.Integer, nullable=False),
        sa.Column("compute_device_hours", sa.Float, nullable=False),
        sa.Column("learner_device_hours", sa.Float, nullable=False),
        sa.Column("generator_device_hours", sa.Float, nullable=False),
        sa.Column("evaluator_device_hours", sa.Float, nullable=False),
        sa.Column("generated_tokens", sa.Integer, nullable=False),
        sa.Column("last_pass_rate", sa.Float, nullable=True),
    )
    op.create_index("ix_jobs_state", "jobs", ["state"])


def downgrade() -> None:
    op.drop_index("ix_jobs_state", "jobs")
    op.drop_table("jobs")
