"""evaluations and manifests: job kinds, run manifests, evaluation summaries, per-example results,
stop reason beat_baseline

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 17:30:00

An evaluation is a job of kind ``evaluation`` (queued, leased and resumed like training); a baseline
evaluation points at its training job through ``parent_id``. ``example_results`` holds how each
scenario fared at each measurement, which is what comparisons bootstrap over. On PostgreSQL
``stopreason`` gains ``beat_baseline``; the downgrade records those stops as ``target``.
"""
from alembic import op
import sqlalchemy as sa
import sqlmodel


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

OLD_VALUES = ("plateau", "target", "max_steps", "divergence", "cancelled", "error", "budget")


def upgrade() -> None:
    # Plain ADD COLUMN, not a batch copy: on SQLite a batch rebuild of ``jobs`` would drop a table the other
    # tables' foreign keys point at. SQLite cannot add the parent_id foreign key afterwards; PostgreSQL does.
    sqlite = op.get_bind().dialect.name == "sqlite"
    op.add_column('jobs', sa.Column('kind', sa.String(length=16), nullable=False, server_default='training'))
    op.add_column('jobs', sa.Column('parent_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=True))
    op.add_column('jobs', sa.Column('manifest', sa.JSON(), nullable=True))
    op.add_column('jobs', sa.Column('summary', sa.JSON(), nullable=True))
    if not sqlite:
        op.create_foreign_key('fk_jobs_parent_id_jobs', 'jobs', 'jobs', ['parent_id'], ['id'])
    op.create_index('ix_jobs_kind_created', 'jobs', ['kind', 'created_at'], unique=False)
    op.add_column('validation_points', sa.Column('tokens_generated', sa.Integer(), nullable=True))
    op.create_table('example_results',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('scenario_id', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.Column('outcome', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('correct', sa.Boolean(), nullable=False),
    sa.Column('reward', sa.Float(), nullable=False),
    sa.Column('completion', sa.Text(), nullable=False),
    sa.Column('completion_tokens', sa.Integer(), nullable=True),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('correct_samples', sa.Integer(), nullable=False),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('job_id', 'step', 'scenario_id')
    )
    with op.batch_alter_table('example_results', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_example_results_job_id'), ['job_id'], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TYPE stopreason ADD VALUE IF NOT EXISTS 'beat_baseline'")


def downgrade() -> None:
    with op.batch_alter_table('example_results', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_example_results_job_id'))
    op.drop_table('example_results')
    op.drop_column('validation_points', 'tokens_generated')
    op.execute("UPDATE jobs SET stop_reason = 'target' WHERE stop_reason = 'beat_baseline'")
    op.execute("DELETE FROM job_events WHERE job_id IN (SELECT id FROM jobs WHERE kind = 'evaluation')")
    op.execute("UPDATE jobs SET parent_id = NULL")
    op.execute("DELETE FROM jobs WHERE kind = 'evaluation'")
    op.drop_index('ix_jobs_kind_created', table_name='jobs')
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint('fk_jobs_parent_id_jobs', 'jobs', type_='foreignkey')
    for column in ('summary', 'manifest', 'parent_id', 'kind'):
        op.drop_column('jobs', column)  # SQLite drops columns in place since 3.35
    if op.get_bind().dialect.name == "postgresql":
        values = ", ".join(f"'{v}'" for v in OLD_VALUES)
        op.execute("ALTER TYPE stopreason RENAME TO stopreason_old")
        op.execute(f"CREATE TYPE stopreason AS ENUM ({values})")
        op.execute("ALTER TABLE jobs ALTER COLUMN stop_reason TYPE stopreason USING stop_reason::text::stopreason")
        op.execute("DROP TYPE stopreason_old")
