"""at most one running job: a unique partial index, so two schedulers (two api replicas, a rolling update) cannot
both start a job

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

RUNNING = sa.text("state = 'running'")


def upgrade() -> None:
    op.create_index("uq_jobs_one_running", "jobs", ["state"], unique=True, sqlite_where=RUNNING,
                    postgresql_where=RUNNING)


def downgrade() -> None:
    op.drop_index("uq_jobs_one_running", "jobs")
