"""Which ``Host`` names the API answers, against DNS rebinding: a page on a domain the attacker controls, once that
name resolves to 127.0.0.1, is same-origin with the server in the browser's eyes and could drive it, but its
requests still carry the attacker's name in ``Host``. The loopback names are always answered (no page can make a
browser send them for another site); in local mode, which has no credentials to steal or check, nothing else is
unless the operator lists it in ``ARTSVC_TRUSTED_HOSTS``, which also restricts a multi-tenant server when set.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.asgi import HTTPMiddleware, send_json_error

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def host_name(host: str) -> str:
    """``host`` (a Host header) without its port, lower-cased: ``[::1]:8000`` is ``[::1]``."""
    name = host.strip().lower()
    if name.startswith("["):
        return name[: name.find("]") + 1]
    return name.rpartition(":")[0] if ":" in name else name


def trusted(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``name`` is one of ``patterns``, each a name or ``*.domain`` (its subdomains, not the domain)."""
    return any(name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:])) for pattern in patterns)


class TrustedHosts(HTTPMiddleware):
    """400 with a JSON ``detail`` for a request whose ``Host`` is not loopback or one of ``trusted_hosts``."""

    def __init__(self, app: ASGIApp, *, trusted_hosts: list[str]) -> None:
        super().__init__(app)
        self.patterns = (*LOOPBACK_NAMES, *(pattern.lower() for pattern in trusted_hosts))

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        host = Headers(scope=scope).get("host", "")
        if trusted(host_name(host), self.patterns):
            await self.app(scope, receive, send)
            return
        detail = (f"this server does not answer for the host {host[:200]!r}: it answers for loopback names and "
                  f"ARTSVC_TRUSTED_HOSTS only; an operator adds a name the service is reached by there")  # fmt: skip
        await send_json_error(send, 400, detail, headers={})
