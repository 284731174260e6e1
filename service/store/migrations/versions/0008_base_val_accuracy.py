"""base val accuracy: the base model's validation accuracy before a job's warm start

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 16:00:00

A job whose policy is warm-started on its environment's demonstrations validates the base model first; that point
is stored at step -1 among the validation points (no schema change) and its accuracy on the job as
``jobs.base_val_accuracy``, beside ``step0_val_accuracy``. Existing jobs start unknown (NULL). The downgrade drops
the column.
"""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('jobs', sa.Column('base_val_accuracy', sa.Float(), nullable=True))


def downgrade() -> None:
    # In place (SQLite since 3.35): a batch copy would drop jobs, which the other tables' foreign keys refuse.
    op.drop_column('jobs', 'base_val_accuracy')
