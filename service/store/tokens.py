"""API tokens as an operator manages them (``artsvc token list`` and ``revoke``): listed without their secrets or
hashes, revoked for good, and when each was last used. Data functions on the caller's session or connection; the
caller commits."""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Connection, bindparam, or_, update
from sqlmodel import Session, col, select

from service.store.tables import ApiToken, Role, utcnow

LAST_USED_RESOLUTION = timedelta(minutes=1)  # a token's last use is written at most this often


class TokenPublic(BaseModel):
    """A token as an operator sees it: everything but its hash."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    role: Role
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class UnknownToken(LookupError):
    """No token has this id."""


_SHOWN = (ApiToken.id, ApiToken.name, ApiToken.role, ApiToken.created_at, ApiToken.last_used_at, ApiToken.revoked_at)
_NOTE_USE = (
    update(ApiToken)
    .where(col(ApiToken.id) == bindparam("token_id"))
    .where(or_(col(ApiToken.last_used_at).is_(None), col(ApiToken.last_used_at) < bindparam("stale_before")))
    .values(last_used_at=bindparam("now"))
)  # fmt: skip


def list_tokens(session: Session) -> list[TokenPublic]:
    """Every token, oldest first, revoked ones included."""
    rows = session.exec(select(*_SHOWN).order_by(col(ApiToken.created_at), col(ApiToken.id))).all()
    return [TokenPublic.model_validate(row._mapping) for row in rows]


def revoke_token(session: Session, *, token_id: str) -> tuple[TokenPublic, bool]:
    """Revoke a token: its bearer use, its dashboard sessions and new logins are refused from the next request on.
    Returns the token and whether this call revoked it (False: it already was, and keeps its first revocation time).
    UnknownToken if no token has this id."""
    row = session.get(ApiToken, token_id)
    if row is None:
        raise UnknownToken(token_id)
    revoked_now = row.revoked_at is None
    if revoked_now:
        row.revoked_at = utcnow()
        session.add(row)
        session.flush()
    return TokenPublic.model_validate(row, from_attributes=True), revoked_now


def note_uses(connection: Connection, *, uses: dict[str, datetime]) -> None:
    """Record when tokens were used (token id -> time), each unless a later use within ``LAST_USED_RESOLUTION`` is
    recorded already (then its statement changes nothing): API processes that saw the same token write it once."""
    connection.execute(
        _NOTE_USE, [{"token_id": token_id, "now": at, "stale_before": at - LAST_USED_RESOLUTION} for token_id, at in uses.items()]
    )
