"""client models: models that ART's own client registers and trains through /v1/preview

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 19:30:00

``client_models`` names a model as ART's client knows it (entity, project, name) per token, with the job that holds
its series (a training job that runs unleased, so no worker claims it); each batch of trajectory groups the client
posts is a ``client_batch`` job whose ``parent_id`` is that job. Job kinds are strings (no enum type to alter). The downgrade drops the table.
"""
import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'client_models',
        sa.Column('id', sa.String(length=36), nullable=False),
        sa.Column('owner_id', sa.String(length=36), nullable=False),
        sa.Column('entity', sa.String(length=64), nullable=False),
        sa.Column('project', sa.String(length=64), nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('base_model', sa.String(length=255), nullable=False),
        sa.Column('job_id', sa.String(length=36), nullable=False),
        sa.Column('step', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('owner_id', 'entity', 'project', 'name'),
    )
    op.create_index('ix_jobs_parent_id', 'jobs', ['parent_id'])


def downgrade() -> None:
    op.drop_index('ix_jobs_parent_id', table_name='jobs')
    op.drop_table('client_models')
