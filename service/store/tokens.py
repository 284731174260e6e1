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


def note_use(connection: Connection, *, token_id: str) -> None:
    """Record that the token was used now, unless that was recorded within ``LAST_USED_RESOLUTION`` (then the
    statement changes nothing): concurrent API processes write at most about once a minute per token."""
    now = utcnow()
    connection.execute(_NOTE_USE, {"token_id": token_id, "now": now, "stale_before": now - LAST_USED_RESOLUTION})
