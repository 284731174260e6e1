"""stop reason budget: a job stops when its judge calls have cost max_judge_cost_usd

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 14:20:00

On PostgreSQL ``stopreason`` is a native enum and gains a value; SQLite stores the enum as text
without a constraint, so there is nothing to change there. The downgrade records budget stops as
``error`` (the reason is kept in the job's error text) and rebuilds the type without the value.
"""
from alembic import op


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

OLD_VALUES = ("plateau", "target", "max_steps", "divergence", "cancelled", "error")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TYPE stopreason ADD VALUE IF NOT EXISTS 'budget'")


def downgrade() -> None:
    op.execute(
        "UPDATE jobs SET error = COALESCE(error, 'stopped: judge budget reached'), stop_reason = 'error' "
        "WHERE stop_reason = 'budget'"
    )
    if op.get_bind().dialect.name == "postgresql":
        values = ", ".join(f"'{v}'" for v in OLD_VALUES)
        op.execute("ALTER TYPE stopreason RENAME TO stopreason_old")
        op.execute(f"CREATE TYPE stopreason AS ENUM ({values})")
        op.execute("ALTER TABLE jobs ALTER COLUMN stop_reason TYPE stopreason USING stop_reason::text::stopreason")
        op.execute("DROP TYPE stopreason_old")
