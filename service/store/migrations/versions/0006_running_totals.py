"""running totals: each step row carries its job's sums so far, each validation point the stopping fold

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26 09:00:00

A training step stores the sums of its job's steps up to it (``totals``) and its judge agreement as a column
with a partial index over the judged steps; a validation point stores the stopping rules' fold of the series up
to it (best step and accuracy, the anchor of the next gain, evaluations without gain). Recording a step, and the
alert rules after it, then read a few recent rows instead of the whole job. Existing rows are filled in from the
rows before them with the same code the service runs (service/store/running.py, service/store/progress.py).
The downgrade drops the columns.
"""
import sqlalchemy as sa
from alembic import op

from service.store.progress import advance
from service.store.running import advanced

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

DEFAULT_MIN_DELTA = 0.01  # ValidationSpec's default, for a stored spec that names none
JUDGED = sa.text("judge_agreement IS NOT NULL")
PROGRESS = ("best_step", "best_accuracy", "anchor_accuracy", "evaluations_without_gain")

steps = sa.table("training_steps", sa.column("id", sa.Integer), sa.column("job_id", sa.String), sa.column("step", sa.Integer),
                 sa.column("metrics", sa.JSON), sa.column("totals", sa.JSON), sa.column("judge_agreement", sa.Float))  # fmt: skip
points = sa.table("validation_points", sa.column("id", sa.Integer), sa.column("job_id", sa.String),
                  sa.column("step", sa.Integer), sa.column("accuracy", sa.Float),
                  *(sa.column(name) for name in PROGRESS))  # fmt: skip
jobs = sa.table("jobs", sa.column("id", sa.String), sa.column("spec", sa.JSON))


def upgrade() -> None:
    with op.batch_alter_table('training_steps', schema=None) as batch_op:
        batch_op.add_column(sa.Column('judge_agreement', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('totals', sa.JSON(), nullable=True))
    with op.batch_alter_table('validation_points', schema=None) as batch_op:
        batch_op.add_column(sa.Column('best_step', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('best_accuracy', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('anchor_accuracy', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('evaluations_without_gain', sa.Integer(), nullable=True))
    _fill_steps()
    _fill_points()
    with op.batch_alter_table('training_steps', schema=None) as batch_op:
        batch_op.alter_column('totals', existing_type=sa.JSON(), nullable=False)
        batch_op.create_index('ix_training_steps_judged', ['job_id', 'step'], unique=False, sqlite_where=JUDGED,
                              postgresql_where=JUDGED)  # fmt: skip
    with op.batch_alter_table('validation_points', schema=None) as batch_op:
        for name in PROGRESS:
            batch_op.alter_column(name, existing_type=sa.Float() if "accuracy" in name else sa.Integer(), nullable=False)


def _fill_steps() -> None:
    bind, totals, job_id, updates = op.get_bind(), {}, None, []
    for row in bind.execute(sa.select(steps.c.id, steps.c.job_id, steps.c.metrics).order_by(steps.c.job_id, steps.c.step)):
        totals = advanced(totals if row.job_id == job_id else {}, row.metrics)
        job_id = row.job_id
        updates.append({"row_id": row.id, "totals": totals, "agreement": row.metrics.get("judge_agreement")})
    if updates:
        update = steps.update().where(steps.c.id == sa.bindparam("row_id"))
        bind.execute(update.values(totals=sa.bindparam("totals"), judge_agreement=sa.bindparam("agreement")), updates)


def _fill_points() -> None:
    bind, progress, job_id, updates = op.get_bind(), None, None, []
    min_delta = {row.id: ((row.spec or {}).get("validation") or {}).get("min_delta", DEFAULT_MIN_DELTA)
                 for row in bind.execute(sa.select(jobs.c.id, jobs.c.spec))}  # fmt: skip
    query = sa.select(points.c.id, points.c.job_id, points.c.step, points.c.accuracy)
    for row in bind.execute(query.order_by(points.c.job_id, points.c.step)):
        before = progress if row.job_id == job_id else None
        progress = advance(before, row.step, row.accuracy, min_delta=min_delta.get(row.job_id, DEFAULT_MIN_DELTA))
        job_id = row.job_id
        updates.append({"row_id": row.id, **{f"new_{name}": getattr(progress, name) for name in PROGRESS}})
    if updates:
        update = points.update().where(points.c.id == sa.bindparam("row_id"))
        bind.execute(update.values(**{name: sa.bindparam(f"new_{name}") for name in PROGRESS}), updates)


def downgrade() -> None:
    with op.batch_alter_table('validation_points', schema=None) as batch_op:
        for name in reversed(PROGRESS):
            batch_op.drop_column(name)
    with op.batch_alter_table('training_steps', schema=None) as batch_op:
        batch_op.drop_index('ix_training_steps_judged', sqlite_where=JUDGED, postgresql_where=JUDGED)
        batch_op.drop_column('totals')
        batch_op.drop_column('judge_agreement')
