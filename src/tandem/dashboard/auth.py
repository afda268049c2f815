"""Who may read the dashboard: a token on every route off loopback, and Host checks.

Bound to loopback without a token, only requests whose Host header names loopback are
served (a web page elsewhere cannot reach the dashboard by DNS rebinding). With a token,
every request (page, JSON, stream, static file) must carry it: `Authorization: Bearer
<token>`, the `tandem_dashboard` cookie, or `?token=` once (answered with the cookie and a
redirect to the same address without the token). Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COOKIE = "tandem_dashboard"
LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or address, IPv6 possibly bracketed) is this machine only."""
    host = host.strip().strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The host part of a Host header: 'a:80' -> 'a', '[::1]:80' -> '::1'."""
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _same(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


MIN_TOKEN = 16


def check_token(token: str | None) -> str | None:
    """`token` if it is long enough to be guess-proof (or None); ValueError otherwise."""
    if token is not None and len(token) < MIN_TOKEN:
        raise ValueError(f"dashboard token: {len(token)} characters is too short to be "
                         f"guess-proof; use at least {MIN_TOKEN} (e.g. from "
                         "python -c 'import secrets; print(secrets.token_urlsafe())')")
    return token


class TokenGate:
    """ASGI middleware: refuse what does not carry the token (401) or names a foreign
    host on an unguarded loopback server (403)."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app, self.token = app, check_token(token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # the dashboard has none: nothing to open
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # lifespan
            return
        headers = _headers(scope)
        if self.token is None:
            if not is_loopback(_host_name(headers.get("host", ""))):
                await _refuse(send, 403, "this dashboard answers only to a loopback Host")
                return
            await self.app(scope, receive, send)
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if _same(query.get("token"), self.token):
            await self._redirect_with_cookie(scope, query, send)
            return
        auth = headers.get("authorization", "")
        bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        cookie = SimpleCookie(headers.get("cookie", "")).get(COOKIE)
        if _same(bearer, self.token) or _same(cookie.value if cookie else None, self.token):
            await self.app(scope, receive, send)
            return
        await _refuse(send, 401, "a dashboard token is required (see the URL printed when "
                                 "the dashboard started)")

    async def _redirect_with_cookie(self, scope: Scope, query: dict[str, str],
                                    send: Send) -> None:
        query.pop("token")
        target = scope.get("root_path", "") + scope["path"] + (
            f"?{urlencode(query)}" if query else "")
        cookie = f"{COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", target.encode("latin-1")),
                                (b"set-cookie", cookie.encode("latin-1")),
                                (b"cache-control", b"no-store"),
                                (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


async def _refuse(send: Send, status: int, why: str) -> None:
    body = why.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"),
               (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="tandem dashboard"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
