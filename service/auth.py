"""Bearer tokens: made by ``artsvc token create``, stored as sha256 hashes, resolved per request.

A token is 32 random bytes, url-safe; only its sha256 hex digest is stored, so a leaked
database does not leak credentials. Lookup is by digest (unique index), one query a request.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass

from sqlmodel import Session, select

from service.store.tables import LOCAL_OWNER, ApiToken, Role

TOKEN_PREFIX = "artsvc_"


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


def authenticate(session: Session, *, token: str) -> Principal | None:
    """The principal of a live token, or None for an unknown or revoked one."""
    row = session.exec(select(ApiToken).where(ApiToken.token_hash == hash_token(token))).first()
    if row is None or row.revoked_at is not None:
        return None
    return Principal(id=row.id, role=row.role)
