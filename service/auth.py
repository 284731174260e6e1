"""Bearer tokens and the dashboard's browser sessions: stored as sha256 hashes, resolved per request.

A token (made by ``artsvc token create``) is 32 random bytes, url-safe; only its sha256 hex digest is
stored, so a leaked database does not leak credentials. Lookup is by digest (unique index), one query a
request, never cached: a token revoked by any process is refused from its next request on. The per-request
lookups are Core statements built once, run on a ``Connection`` (the API's event loop has one; a ``Session``
gives its own with ``session.connection()``): through the ORM they cost several times as much, and they are on
every request's path. A browser never holds the token: logging in to the dashboard makes a session whose random
secret goes into the cookie and stands for the token until it expires, is logged out, or the token is
revoked.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Connection, Row, bindparam
from sqlmodel import Session, col, delete, select

from service.store.tables import LOCAL_OWNER, ApiToken, BrowserSession, Role, utcnow

TOKEN_PREFIX = "artsvc_"
SESSIONS_PER_TOKEN = 16  # live dashboard logins one token may hold; a new login beyond ends the oldest

LIVE_TOKEN = (ApiToken.token_hash == bindparam("token_hash"), col(ApiToken.revoked_at).is_(None))  # bind token_hash
_LIVE_TOKEN = select(ApiToken.id, ApiToken.role).where(*LIVE_TOKEN)
_BROWSER_LOGIN = (
    select(
        BrowserSession.revoked_at, BrowserSession.expires_at,
        ApiToken.id, ApiToken.role, col(ApiToken.revoked_at).label("token_revoked_at"),
    )
    .join(ApiToken, col(ApiToken.id) == col(BrowserSession.token_id))
    .where(BrowserSession.secret_hash == bindparam("secret_hash"))
)  # fmt: skip


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's id (the owner of the jobs it submits) and its role."""

    id: str
    role: Role

    @property
    def is_operator(self) -> bool:
        return self.role is Role.operator


LOCAL_PRINCIPAL = Principal(id=LOCAL_OWNER, role=Role.operator)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, *, role: Role, name: str) -> tuple[ApiToken, str]:
    """A new token row and the secret to hand out (shown once, never stored)."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(id=str(uuid.uuid4()), name=name, role=role, token_hash=hash_token(secret))
    session.add(row)
    return row, secret


def authenticate(connection: Connection, *, token: str) -> Principal | None:
    """The principal of a live token, or None for an unknown or revoked one."""
    row = _live_token(connection, token=token)
    return None if row is None else Principal(id=row.id, role=row.role)


def create_browser_session(session: Session, *, token: str, ttl_s: int) -> tuple[BrowserSession, str] | None:
    """A session of a live token lasting ``ttl_s`` seconds and the secret for the browser's cookie (never stored);
    None for an unknown or revoked token. Expired sessions are deleted on the way, and so are the token's oldest
    beyond ``SESSIONS_PER_TOKEN``: logging in again and again cannot grow the table."""
    row = _live_token(session.connection(), token=token)
    if row is None:
        return None
    now = utcnow()
    session.exec(delete(BrowserSession).where(col(BrowserSession.expires_at) < now))
    newest_first = select(BrowserSession.id).where(BrowserSession.token_id == row.id)
    oldest = newest_first.order_by(col(BrowserSession.created_at).desc()).offset(SESSIONS_PER_TOKEN - 1)
    session.exec(delete(BrowserSession).where(col(BrowserSession.id).in_(session.exec(oldest).all())))
    secret = secrets.token_urlsafe(32)
    login = BrowserSession(id=str(uuid.uuid4()), secret_hash=hash_token(secret), token_id=row.id, created_at=now,
                           expires_at=now + timedelta(seconds=ttl_s))  # fmt: skip
    session.add(login)
    return login, secret


def authenticate_browser_session(connection: Connection, *, secret: str) -> Principal | None:
    """The principal behind a session secret, or None when the session is unknown, expired or logged out, or its
    token was revoked."""
    login = connection.execute(_BROWSER_LOGIN, {"secret_hash": hash_token(secret)}).first()
    if login is None or login.expires_at <= utcnow():
        return None
    if login.revoked_at is not None or login.token_revoked_at is not None:  # logged out, or its token revoked
        return None
    return Principal(id=login.id, role=login.role)


def revoke_browser_session(session: Session, *, secret: str) -> None:
    """Log a session out for good: its secret is refused from now on, even if the browser kept it."""
    login = session.exec(select(BrowserSession).where(BrowserSession.secret_hash == hash_token(secret))).first()
    if login is not None and login.revoked_at is None:
        login.revoked_at = utcnow()
        session.add(login)


def _live_token(connection: Connection, *, token: str) -> Row[tuple[str, Role]] | None:
    """The id and role of a live token."""
    return connection.execute(_LIVE_TOKEN, {"token_hash": hash_token(token)}).first()
