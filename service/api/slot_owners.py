"""Whom a request's slot belongs to (service/api/overload.py): the token behind its credential, resolved before the
request is counted, so that one tenant's share cannot be multiplied by spelling its header another way
(``Bearer``, ``BEARER``) or by sending made-up tokens.

A bearer token (scheme in any case) and a dashboard session cookie resolve to their token's id; every request
without a valid credential (none, malformed, unknown, revoked) belongs to ``UNAUTHENTICATED``, one small pool of
its own. A resolved token is remembered for ``REMEMBER_S`` in a cache of at most ``REMEMBERED`` entries, keyed by its
sha256, so a tenant's requests cost no lookup; only valid credentials are remembered, so a flood of made-up ones
cannot grow it, and each of them costs one keyed read on the event loop's own connection (service/api/loop_reads.py,
bounded in time), the read its authentication would have made anyway. The cache only says whose slot a request
takes: every request is still authenticated afresh by its route (service/api/deps.py), so a revoked token is
refused at once and only keeps its slot key for up to ``REMEMBER_S``.
"""

from __future__ import annotations

import hmac
import time
from collections import OrderedDict

from fastapi.security.utils import get_authorization_scheme_param
from pydantic import SecretStr
from sqlalchemy.exc import SQLAlchemyError
from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.types import Scope

from service.api.browser_auth import SESSION_COOKIE
from service.api.loop_reads import LoopReads
from service.auth import LOCAL_PRINCIPAL, authenticate, authenticate_browser_session, hash_token

UNAUTHENTICATED = ""  # the owner of every request without a valid credential (no token id is empty)
METRICS_SCRAPER = "metrics"  # the owner of requests carrying ARTSVC_METRICS_TOKEN (token ids are uuids)
REMEMBERED = 1024  # resolved credentials kept: far past the tenants one process serves at once
REMEMBER_S = 30.0  # how long a resolved credential is trusted for slot keying (never for authentication)


class SlotOwners:
    """``owner(scope)``: the token id a request counts against, ``UNAUTHENTICATED``, or in local mode the one
    operator. Lookups that fail (the store down or slow) count as unauthenticated: the route then answers for
    itself."""

    def __init__(self, reads: LoopReads, *, local_mode: bool, metrics_token: SecretStr | None) -> None:
        self.reads = reads
        self.local_mode = local_mode
        self.metrics_token = None if metrics_token is None else metrics_token.get_secret_value().encode()
        self._remembered: OrderedDict[str, tuple[str, float]] = OrderedDict()  # sha256 -> (owner, until)

    def owner(self, scope: Scope) -> str:
        if self.local_mode:
            return LOCAL_PRINCIPAL.id
        headers = Headers(scope=scope)
        if (authorization := headers.get("authorization")) is not None:
            scheme, token = get_authorization_scheme_param(authorization)
            if scheme.lower() != "bearer" or not token:
                return UNAUTHENTICATED
            if self.metrics_token is not None and hmac.compare_digest(token.encode(), self.metrics_token):
                return METRICS_SCRAPER
            return self._resolve("token", token)
        if secret := cookie_parser(headers.get("cookie", "")).get(SESSION_COOKIE):
            return self._resolve("session", secret)
        return UNAUTHENTICATED

    def _resolve(self, kind: str, secret: str) -> str:
        key = hash_token(f"{kind}:{secret}")
        now = time.monotonic()
        if (found := self._remembered.get(key)) is not None and found[1] > now:
            self._remembered.move_to_end(key)
            return found[0]
        try:
            if kind == "token":
                principal = self.reads.run(authenticate, token=secret)
            else:
                principal = self.reads.run(authenticate_browser_session, secret=secret)
        except SQLAlchemyError:
            return UNAUTHENTICATED
        if principal is None:
            self._remembered.pop(key, None)
            return UNAUTHENTICATED
        self._remembered[key] = (principal.id, now + REMEMBER_S)
        self._remembered.move_to_end(key)
        if len(self._remembered) > REMEMBERED:
            self._remembered.popitem(last=False)
        return principal.id
