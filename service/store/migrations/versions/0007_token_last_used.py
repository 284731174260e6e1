"""token last used: when a token last authenticated a request, to the minute

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 09:00:00

``api_tokens.last_used_at`` is written at most once a minute per token and API process (service/api/token_use.py),
so that ``artsvc token list`` shows which tokens are still in use before one is revoked. Existing tokens start
unknown (NULL). The downgrade drops the column.
"""
import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('api_tokens', sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # In place (SQLite since 3.35): a batch copy would drop api_tokens, which browser_sessions' foreign key refuses.
    op.drop_column('api_tokens', 'last_used_at')
