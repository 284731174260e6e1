"""browser sessions: the dashboard's login cookie holds a session secret, not the API token

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 09:00:00

A login stores the sha256 of a random session secret with its API token, an expiry and a revocation time;
the browser gets the secret. Logging out revokes the row; revoking the token ends its sessions. The
downgrade drops the table, which logs every browser out.
"""
import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('browser_sessions',
    sa.Column('id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('secret_hash', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('token_id', sqlmodel.sql.sqltypes.AutoString(length=36), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['token_id'], ['api_tokens.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('secret_hash')
    )
    with op.batch_alter_table('browser_sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_browser_sessions_token_id'), ['token_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_browser_sessions_expires_at'), ['expires_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('browser_sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_browser_sessions_expires_at'))
        batch_op.drop_index(batch_op.f('ix_browser_sessions_token_id'))
    op.drop_table('browser_sessions')
